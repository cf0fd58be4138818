"""Where a run goes on a Slurm fleet and what it asks Slurm for (`runs/slurm_runs.py`),
decided from the partitions the fleet recorded: the same at plan time and at apply."""

from __future__ import annotations

import pytest

from dstack_plan.config.runs import RunSpec
from dstack_plan.config.slurm_backend import SlurmCluster
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.slurm_records import SlurmFleetRecord
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.slurm.partitions import Partition, parse_nodes, partitions_of
from dstack_plan.runs.slurm_runs import plan_run

CLUSTER = SlurmCluster(
    name="hpc",
    hostname="login",
    user="alice",
    gpu_partitions=[
        {"gpu": "A100", "partitions": ["a100"]},
        {"gpu": "H100", "partitions": ["h100"], "gres": "gpu:h100"},
    ],
    cpu_partitions=["cpu"],
    account="ml",
)
NODES = "\n".join(
    [
        "NodeName=a1 CPUTot=64 RealMemory=512000 Gres=gpu:4 State=IDLE Partitions=a100",
        "NodeName=a2 CPUTot=64 RealMemory=512000 Gres=gpu:4 State=ALLOCATED Partitions=a100",
        "NodeName=h1 CPUTot=96 RealMemory=1024000 Gres=gpu:h100:8(S:0-1) State=MIXED "
        "Partitions=h100",
        "NodeName=c1 CPUTot=32 RealMemory=128000 Gres=(null) State=IDLE Partitions=cpu",
        "NodeName=c2 CPUTot=32 RealMemory=128000 Gres=(null) State=DOWN+NOT_RESPONDING "
        "Reason=fan failure [root@2026-12-07T10:00:00] Partitions=cpu",
    ]
)


def record() -> SlurmFleetRecord:
    return SlurmFleetRecord(
        cluster=CLUSTER, partitions=tuple(partitions_of(CLUSTER, parse_nodes(NODES)))
    )


def task(**fields: object) -> RunSpec:
    spec = spec_from_normalized(
        "task", {"type": "task", "name": "train", "commands": ["true"], **fields}
    )
    assert isinstance(spec, RunSpec)
    return spec


def test_partitions_as_the_nodes_say() -> None:
    by_name = {p.name: p for p in record().partitions}
    assert by_name["a100"] == Partition(
        name="a100", nodes=2, usable=2, idle=1, cpus=64, memory_mb=512000, gpus=4,
        gpu="A100", vendor="nvidia", gres="gpu",
    )  # fmt: skip
    assert (by_name["h100"].gpus, by_name["h100"].gres) == (8, "gpu:h100")
    assert (by_name["cpu"].nodes, by_name["cpu"].usable, by_name["cpu"].gpus) == (2, 1, 0)


def test_a_multi_node_gpu_run_asks_for_its_per_node_share() -> None:
    spec = task(
        nodes=2,
        resources={"gpu": "A100:4", "cpu": "16..", "memory": "64GB.."},
        max_duration="90m",
        stop_duration="45s",
    )
    plan = plan_run(spec, record(), comment="dep/t")
    assert plan.partition.name == "a100" and plan.container is None
    assert plan.request.options() == [
        "--partition=a100", "--nodes=2", "--ntasks-per-node=1", "--no-requeue",
        "--cpus-per-task=16", "--mem=65536M", "--gres=gpu:4", "--time=90",
        "--signal=B:TERM@45", "--account=ml",
    ]  # fmt: skip


def test_a_typed_gres_and_the_model_decide_the_partition() -> None:
    plan = plan_run(task(resources={"gpu": "H100:2"}), record())
    assert (plan.partition.name, plan.request.gres) == ("h100", "gpu:h100:2")


def test_a_run_no_partition_can_take_says_why_per_partition() -> None:
    with pytest.raises(ProviderError) as info:
        plan_run(task(nodes=2, resources={"cpu": "8.."}), record())
    assert "cpu: has 1 usable node(s), the run needs 2" in str(info.value)
    assert "a100: a GPU partition: runs without GPUs go to the CPU partitions" in str(info.value)
    with pytest.raises(ProviderError, match="a100: needs 8 GPUs A100, has 4 suitable; h100: "):
        plan_run(task(resources={"gpu": "A100:8"}), record())


def test_an_image_without_container_support_is_refused_and_with_it_runs_there() -> None:
    with pytest.raises(ProviderError, match="runs no containers \\(containers: none"):
        plan_run(task(image="python:3.12"), record())
    pyxis = record().model_copy(
        update={"cluster": CLUSTER.model_copy(update={"containers": "pyxis"})}
    )
    plan = plan_run(
        task(image="nvcr.io/nvidia/pytorch:24.01-py3", resources={"gpu": "A100:1"}), pyxis
    )
    assert plan.container is not None and plan.container.tool == "pyxis" and plan.container.gpus


@pytest.mark.parametrize(
    ("kind", "fields", "message"),
    [
        ("service", {"port": 8000, "commands": ["true"], "files": ["."]}, "files: and repos:"),
        ("dev-environment", {"ide": "vscode"}, "dev-environments cannot run on a Slurm fleet"),
        ("task", {"commands": ["true"], "files": ["."]}, "files: and repos: are not sent"),
    ],
)
def test_what_a_slurm_fleet_cannot_run_yet_is_refused(
    kind: str, fields: dict[str, object], message: str
) -> None:
    spec = spec_from_normalized(kind, {"type": kind, "name": "xx", **fields})
    assert isinstance(spec, RunSpec)
    with pytest.raises(ProviderError, match=message):
        plan_run(spec, record())
