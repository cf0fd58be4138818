"""Fragmentation-aware packing: the FGD score, and the choices `place` makes with it (small
jobs fill partly used hosts, big hosts stay whole, ties go by host name, priority first)."""

from __future__ import annotations

from typing import Any

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.runs import TaskSpec
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.runs.placing import HostRun, place_on_fleet
from dstack_plan.scheduler.packing import (
    UNIFORM,
    WHOLE,
    HostState,
    Scorer,
    Shape,
    Workload,
    choice_key,
    fits,
    model_pressure,
    stranded,
)
from dstack_plan.scheduler.placement import Candidate, HostJob, JobDemand, place

SMALL = {"cpu": 1, "memory": "0.1GB..", "disk": "1GB.."}
H100 = GPU(vendor="nvidia", name="NVIDIA H100 80GB HBM3", memory_mib=81920)


def machine(gpus: int) -> MachineResources:
    return MachineResources(cpus=8, memory_gb=64, disk_gb=200, gpus=(H100,) * gpus)


def host(name: str, gpus: int, busy: int = 0) -> Candidate:
    held = (HostJob("task.other", gpus=busy),) if busy else ()
    return Candidate("pool", "ssh", name, machine(gpus), held)


def job(gpus: int = 0, label: str = "job") -> JobDemand:
    extra: dict[str, Any] = {"gpu": gpus} if gpus else {}
    return JobDemand(label, ResourcesSpec.model_validate({**SMALL, **extra}))


def task(name: str, gpus: int, **fields: Any) -> HostRun:
    data = {"type": "task", "name": name, "commands": ["x"], "resources": {**SMALL, "gpu": gpus}}
    return HostRun(f"task.{name}", name, TaskSpec.model_validate({**data, **fields}), True)


def state(*free: int, model: str = "A", cpu: int = 8000, memory: int = 65536) -> HostState:
    return HostState(model, cpu, memory, tuple(sorted(free, reverse=True)))


def test_stranded_capacity_follows_the_paper_cases() -> None:
    half_used = state(WHOLE, WHOLE, 300, 0)
    assert stranded(half_used, Shape(gpus=1, gpu_milli=500)) == 300  # the 0.3 GPU is too small
    assert stranded(half_used, Shape(gpus=1)) == 300  # a whole-GPU job cannot use the part
    assert stranded(half_used, Shape(gpus=4)) == 2300  # not enough whole GPUs: all stranded
    assert stranded(half_used, Shape(cpu=9000)) == 2300  # no CPU left for it: all stranded
    assert stranded(half_used, Shape()) == 0  # a CPU-only job that fits strands nothing
    assert stranded(half_used, Shape(gpus=1, models=frozenset({"B"}))) == 2300  # other model


def test_a_shared_job_takes_the_gpu_that_keeps_whole_gpus_whole() -> None:
    scorer = Scorer(Workload.from_shapes([Shape(gpus=1), Shape(gpus=1, gpu_milli=500)]))
    move = scorer.move(state(WHOLE, 600), Shape(gpus=1, gpu_milli=500))
    assert move is not None and move.after.gpus == (WHOLE, 100)
    assert scorer.move(state(400), Shape(gpus=1, gpu_milli=500)) is None
    assert not fits(state(400), Shape(gpus=1, gpu_milli=500))


def test_a_small_job_fills_a_partly_used_host_and_leaves_the_whole_one_for_big_jobs() -> None:
    hosts = [host("a-free", 8), host("b-busy", 8, busy=7)]
    assert [c.host for c in place([job(1)], hosts, False).hosts] == ["b-busy"]
    # with first fit it went to a-free: then no host could take an 8-GPU job any more
    assert [c.host for c in place([job(8)], hosts, False).hosts] == ["a-free"]


def test_a_cpu_only_job_leaves_gpu_hosts_alone() -> None:
    hosts = [host("a-gpu", 8), host("z-cpu", 0)]
    assert [c.host for c in place([job(0)], hosts, False).hosts] == ["z-cpu"]


def test_equal_hosts_are_chosen_by_name_whatever_their_order() -> None:
    for order in (["n3", "n1", "n2"], ["n2", "n3", "n1"]):
        decision = place([job(2)], [host(n, 4) for n in order], False)
        assert [c.host for c in decision.hosts] == ["n1"]


def test_an_explicit_workload_changes_the_choice() -> None:
    hosts = [host("a-two", 2), host("b-four", 4, busy=1)]
    # 2-GPU jobs expected: taking one of b's 3 free GPUs strands nothing new for them
    two = Workload.from_shapes([Shape(gpus=2)])
    assert [c.host for c in place([job(1)], hosts, False, two).hosts] == ["b-four"]
    # 3-GPU jobs expected: b is the only host that could run one, keep it
    three = Workload.from_shapes([Shape(gpus=3)])
    assert [c.host for c in place([job(1)], hosts, False, three).hosts] == ["a-two"]


def test_a_gang_takes_distinct_hosts_or_none() -> None:
    hosts = [host("a", 8, busy=6), host("b", 8), host("c", 8, busy=8)]
    gang = [job(4, f"node {n}") for n in range(3)]
    decision = place(gang, hosts, distinct=True)
    assert decision.pending and not decision.hosts  # c is busy: no partial gang of a and b
    two = place(gang[:2], hosts, distinct=True)
    assert two.pending and not two.hosts  # only b has 4 free GPUs now
    assert sorted(c.host for c in place(gang[:2], hosts[:2], distinct=True).hosts) == []
    assert [c.host for c in place(gang[:1], hosts, distinct=True).hosts] == ["b"]


def test_higher_priority_runs_are_placed_first_in_a_batch() -> None:
    runs = [task("low", 1, priority=1), task("high", 1, priority=50)]
    result = place_on_fleet(runs, [host("only", 1)], {}, "dep")
    assert result.placements["task.high"].placed
    assert result.placements["task.low"].pending


def test_the_default_workload_is_uniform_whole_gpu_jobs() -> None:
    assert [s.gpus for s, _ in UNIFORM.classes] == [1, 2, 4, 8]
    assert abs(sum(p for _, p in UNIFORM.classes) - 1) < 1e-9


def test_a_job_that_runs_on_any_model_leaves_the_scarce_one_to_jobs_that_need_it() -> None:
    # G3-only jobs are a tenth of the demand on a twentieth of the capacity; G2-only jobs
    # three tenths on most of it; the rest run anywhere
    g3, g2 = Shape(gpus=1, models=frozenset({"G3"})), Shape(gpus=1, models=frozenset({"G2"}))
    workload = Workload.from_shapes([g3] + [g2] * 3 + [Shape(gpus=1)] * 6)
    pressure = model_pressure(workload, {"G3": 5 * WHOLE, "G2": 95 * WHOLE})
    assert pressure["G3"] > 1 > pressure["G2"]
    scorer = Scorer(workload)
    anywhere = Shape(gpus=1)
    moves = {m: scorer.move(state(WHOLE, WHOLE, model=m), anywhere) for m in ("G3", "G2")}
    assert moves["G3"] is not None and moves["G2"] is not None
    # FGD alone prefers G3 (fewer kinds of job can use it), and strands the G3-only jobs
    assert moves["G3"].rank() < moves["G2"].rank()
    keys = {m: choice_key(move, pressure[m], m) for m, move in moves.items() if move}
    assert min(keys, key=keys.__getitem__) == "G2"


def test_without_model_constraints_pressure_is_flat() -> None:
    assert set(model_pressure(UNIFORM, {"T4": WHOLE, "G2": 8 * WHOLE}).values()) == {0.0}


def test_a_gang_prefers_the_best_linked_hosts_when_links_are_measured() -> None:
    hosts = [host(n, 8) for n in ("a", "b", "c", "d")]
    gang = [job(8, f"node {n}") for n in range(2)]
    assert [c.host for c in place(gang, hosts, distinct=True).hosts] == ["a", "b"]
    links = {("a", "b"): 1e9, ("c", "d"): 1e10, ("a", "c"): 1e9, ("b", "d"): 1e9}
    decision = place(gang, hosts, distinct=True, bandwidth=links)
    assert sorted(c.host for c in decision.hosts) == ["c", "d"]
    busy = [*hosts[:3], host("d", 8, busy=1)]  # d cannot take a node now: never half a gang
    decision = place(gang, busy, distinct=True, bandwidth=links)
    assert len({c.host for c in decision.hosts}) == 2 and "d" not in {
        c.host for c in decision.hosts
    }
