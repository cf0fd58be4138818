"""`total_memory` with a count range: on a host the job takes as many GPUs as its range allows
until their memory reaches the lower bound (two 40GB A100s for `80GB..`, one 80GB A100), and
the agent is asked for that many; when no count in range reaches it, the host never fits."""

from __future__ import annotations

from pathlib import Path

from dstack_plan.config.loader import load_text
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.providers.matching import gpus_needed, static_mismatch
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job
from dstack_plan.scheduler.placement import Candidate, HostJob, JobDemand, place

A100_40 = GPU(vendor="nvidia", name="NVIDIA A100-PCIE-40GB", memory_mib=40960)
A100_80 = GPU(vendor="nvidia", name="NVIDIA A100-SXM4-80GB", memory_mib=81920)
BIG = {
    "cpu": 1,
    "memory": "0.1GB..",
    "disk": "1GB..",
    "gpu": {"count": "1..4", "total_memory": "80GB.."},
}


def machine(*gpus: GPU) -> MachineResources:
    return MachineResources(cpus=8, memory_gb=64, disk_gb=200, gpus=gpus)


def test_the_count_grows_until_total_memory_is_reached() -> None:
    spec = ResourcesSpec.model_validate(BIG)
    assert gpus_needed(spec.gpu, machine(A100_40, A100_40, A100_40).gpus) == 2
    assert gpus_needed(spec.gpu, machine(A100_80, A100_80).gpus) == 1
    assert static_mismatch(spec, machine(A100_40, A100_40)) is None
    assert static_mismatch(spec, machine(A100_40)) == (
        "needs 80GB.. total GPU memory, 1 GPU NVIDIA A100-PCIE-40GB give 40GB"
    )
    capped = ResourcesSpec.model_validate(
        {**BIG, "gpu": {"count": "1..1", "total_memory": "80GB.."}}
    )
    assert static_mismatch(capped, machine(A100_40, A100_40)) is not None  # 1 GPU at most


def test_placement_holds_and_waits_for_the_grown_count() -> None:
    demand = JobDemand("job", ResourcesSpec.model_validate(BIG))
    host = Candidate("f", "ssh", "h1", machine(A100_40, A100_40, A100_40))
    assert place([demand], [host], distinct=False).placed
    one_left = host._replace(busy=(HostJob("task.other", gpus=2, gpu_indices=(0, 1)),))
    decision = place([demand], [one_left], distinct=False)
    assert decision.pending and decision.reason == "waits for 2 GPUs on f, busy with task.other"
    two = place([demand, demand._replace(label="job 2")], [host], distinct=False)
    # 2 + 2 of 3 GPUs even with nothing else there: never, not squeezed onto 1 GPU
    assert two.never and two.reason == "f (h1): job 2: needs 2 free GPUs, 1 free (busy with job)"


def test_the_agent_is_asked_for_the_grown_count(tmp_path: Path) -> None:
    text = (
        "type: task\nname: train\ncommands: ['true']\n"
        "resources: {gpu: {count: 1..4, total_memory: 80GB..}}\n"
    )
    [resource], issues = load_text(text, "t.dstack.yml")
    assert not issues and isinstance(resource.spec, RunSpec)
    ctx = JobContext("train", "run-id", 0, "abc123", 1, "127.0.0.1", ("127.0.0.1",))
    job = build_job(
        resource.spec, JobSlot(0, 0), ctx, SecretStore(tmp_path), environ={},
        host_gpus=(A100_40,) * 4,
    )  # fmt: skip
    assert job.gpus == 2
    assert job.env["DSTACK_GPUS_PER_NODE"] == "2"
