"""Shared GPUs in placement: jobs asking a share of one GPU pack onto one GPU, whole-GPU jobs
need GPUs nobody shares, a share that fits nowhere waits with how much is free, and (a
property) what the scheduler places is always what the agent's allocation rule accepts, with
the shares on a GPU never above one."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.fleets.host_load import busy_jobs
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.scheduler.occupancy import gpu_free, percent, take
from dstack_plan.scheduler.placement import Candidate, HostJob, JobDemand, held_by, place

L4 = GPU(vendor="nvidia", name="NVIDIA L4", memory_mib=23034)


@lru_cache
def resources(gpu: str | float | None) -> ResourcesSpec:
    extra = {} if gpu is None else {"gpu": gpu}
    return ResourcesSpec.model_validate({"cpu": 1, "memory": "0.1GB..", "disk": "1GB..", **extra})


def host(name: str, gpus: int, *busy: HostJob) -> Candidate:
    machine = MachineResources(cpus=8, memory_gb=64, disk_gb=200, gpus=(L4,) * gpus)
    return Candidate("f", "ssh", name, machine, busy)


def job(gpu: str | float | None, label: str = "job") -> JobDemand:
    return JobDemand(label, resources(gpu))


def test_shares_pack_onto_the_fullest_gpu_that_fits() -> None:
    running = HostJob("task.a", gpus=1, gpu_share=600, gpu_indices=(1,))
    one = host("h1", 2, running)
    assert gpu_free(2, one.busy) == [WHOLE, 400]
    placed = place([job("40%")], [one], distinct=False)
    assert placed.placed  # onto GPU 1 (400 free), leaving GPU 0 whole for a whole-GPU job
    after = gpu_free(2, [*one.busy, held_by(job("40%"), "task.b")])
    assert after == [WHOLE, 0]
    whole = place([job(1)], [one._replace(busy=(*one.busy, held_by(job("40%"), "b")))], False)
    assert whole.placed


def test_a_whole_gpu_job_waits_for_a_gpu_nobody_shares() -> None:
    shared = host("h1", 1, HostJob("task.small", gpus=1, gpu_share=100, gpu_indices=(0,)))
    decision = place([job(1)], [shared], distinct=False)
    assert decision.pending
    assert decision.reason == "waits for 1 GPU on f, busy with task.small"


def test_a_share_that_fits_no_gpu_waits_saying_how_much_is_free() -> None:
    busy = (
        HostJob("task.a", gpus=1, gpu_share=500, gpu_indices=(0,)),
        HostJob("task.b", gpus=1, gpu_share=300, gpu_indices=(0,)),
    )
    decision = place([job("30%")], [host("h1", 1, *busy)], distinct=False)
    assert decision.pending
    assert decision.reason == "waits for 30% of a GPU on f, busy with task.a, task.b"
    assert place([job("20%")], [host("h1", 1, *busy)], distinct=False).placed


def test_replicas_with_shares_share_one_gpu() -> None:
    replicas = [job(0.5, "replica 0"), job(0.5, "replica 1")]
    decision = place(replicas, [host("h1", 1)], distinct=False)
    assert [c.host for c in decision.hosts] == ["h1", "h1"]
    three = [*replicas, job(0.5, "replica 2")]
    assert place(three, [host("h1", 1)], distinct=False).pending is False  # never: 1.5 > 1
    assert "needs 50% of a GPU" in (place(three, [host("h1", 1)], distinct=False).reason or "")


def test_running_shared_jobs_from_the_agent_hold_their_share() -> None:
    info = JobInfo.model_validate(
        {
            "id": "j1",
            "run_name": "a",
            "runtime": "process",
            "status": "running",
            "submitted_at": 1.0,
            "gpus": [0],
            "gpu_share": 250,
            "spec": {"labels": {"deployment": "d", "address": "task.a"}},
        }
    )
    (held,) = busy_jobs([info], "d")
    assert held.held == HostJob("task.a", gpus=1, gpu_share=250, gpu_indices=(0,))
    assert percent(held.held.gpu_share) == "25%" and percent(125) == "12.5%"


asks = st.lists(
    st.sampled_from([None, 1, 2, "10%", "25%", "50%", "75%", 0.9]), min_size=1, max_size=12
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), asks)
def test_what_is_placed_the_agent_accepts_and_shares_never_sum_above_one(
    gpus: int, sequence: list[str | float | None]
) -> None:
    held: list[tuple[HostJob, tuple[int, ...]]] = []  # what the agent gave each placed job
    for n, ask in enumerate(sequence):
        busy = tuple(h._replace(gpu_indices=idx) for h, idx in held)
        decision = place([job(ask, f"j{n}")], [host("h1", gpus, *busy)], distinct=False)
        demand = held_by(job(ask), f"task.j{n}")
        per_gpu = [WHOLE] * gpus
        for h, idx in held:
            for i in idx:
                per_gpu[i] -= h.gpu_share
        given_ = take(per_gpu, demand.gpus, demand.gpu_share) if demand.gpus else ()
        assert decision.placed == (given_ is not None)  # the agent's rule agrees
        if decision.placed and given_ is not None:
            held.append((demand, given_))
    totals = [0] * gpus
    for h, idx in held:
        for i in idx:
            totals[i] += h.gpu_share
    assert all(total <= WHOLE for total in totals)
