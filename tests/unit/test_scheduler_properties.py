"""Properties of placement on random clusters (hypothesis): no host is ever given more GPUs
than it has, gangs are all or nothing on distinct hosts, what fits an empty cluster is placed
on it, equal inputs give equal placements whatever the candidate order; and packing moves
never take more than is free (shares of one GPU never sum above one)."""

from __future__ import annotations

import random
from functools import lru_cache
from itertools import product

from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.scheduler.packing import (
    WHOLE,
    HostState,
    Scorer,
    Shape,
    Workload,
    fits,
    stranded,
)
from dstack_plan.scheduler.placement import Candidate, HostJob, JobDemand, place

T4 = GPU(vendor="nvidia", name="Tesla T4", memory_mib=15360)


@lru_cache
def resources(gpus: int) -> ResourcesSpec:
    extra = {"gpu": gpus} if gpus else {}
    return ResourcesSpec.model_validate({"cpu": 1, "memory": "0.1GB..", "disk": "1GB..", **extra})


@lru_cache
def machine(gpus: int) -> MachineResources:
    return MachineResources(cpus=4, memory_gb=16, disk_gb=100, gpus=(T4,) * gpus)


hosts = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=6).map(
    lambda specs: [
        Candidate(
            "f",
            "ssh",
            f"h{i}",
            machine(total),
            (HostJob("task.busy", gpus=min(busy, total)),) if busy and total else (),
        )
        for i, (total, busy) in enumerate(specs)
    ]
)
runs = st.tuples(st.integers(0, 8), st.integers(1, 4), st.booleans())


def demands(gpus: int, count: int) -> list[JobDemand]:
    return [JobDemand(f"node {n}", resources(gpus)) for n in range(count)]


def free(c: Candidate) -> int:
    return len(c.resources.gpus) - sum(j.gpus for j in c.busy)


def feasible(gpus: int, count: int, cands: list[Candidate], distinct: bool) -> bool:
    """Brute force: is there any assignment of the jobs to hosts?"""
    for hosts_ in product(range(len(cands)), repeat=count):
        if distinct and len(set(hosts_)) < count:
            continue
        if all(gpus * hosts_.count(i) <= free(c) for i, c in enumerate(cands)):
            return True
    return False


links = st.dictionaries(
    st.tuples(
        st.sampled_from([f"h{i}" for i in range(6)]), st.sampled_from([f"h{i}" for i in range(6)])
    ),
    st.floats(1e6, 1e10),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(hosts, runs, links)
def test_no_host_gets_more_gpus_than_it_has_and_gangs_are_whole(
    cands: list[Candidate], run: tuple[int, int, bool], bandwidth: dict[tuple[str, str], float]
) -> None:
    gpus, count, distinct = run
    decision = place(demands(gpus, count), cands, distinct, bandwidth=bandwidth)
    if decision.placed:
        assert len(decision.hosts) == count
        for c in cands:
            assert gpus * sum(h.host == c.host for h in decision.hosts) <= free(c)
        if distinct:
            assert len({h.host for h in decision.hosts}) == count
    else:
        assert decision.hosts == ()
    # the scored choice never misses an assignment that exists
    assert decision.placed == feasible(gpus, count, cands, distinct)


@settings(max_examples=100, deadline=None)
@given(hosts, runs)
def test_what_fits_an_empty_cluster_is_placed_on_it(
    cands: list[Candidate], run: tuple[int, int, bool]
) -> None:
    gpus, count, distinct = run
    empty = [c._replace(busy=()) for c in cands]
    decision = place(demands(gpus, count), empty, distinct)
    assert decision.placed == feasible(gpus, count, empty, distinct)
    assert not decision.pending  # on an empty cluster nothing waits for anything
    busy = place(demands(gpus, count), cands, distinct)
    if decision.placed:
        assert not busy.never  # busy hosts can make it wait, never unplaceable


@settings(max_examples=100, deadline=None)
@given(hosts, runs, st.randoms(use_true_random=False))
def test_placements_do_not_depend_on_candidate_order(
    cands: list[Candidate], run: tuple[int, int, bool], rnd: random.Random
) -> None:
    gpus, count, distinct = run
    shuffled = list(cands)
    rnd.shuffle(shuffled)
    first = place(demands(gpus, count), cands, distinct)
    again = place(demands(gpus, count), shuffled, distinct)
    assert [h.host for h in first.hosts] == [h.host for h in again.hosts]
    assert (first.pending, first.never) == (again.pending, again.never)


shapes = st.builds(
    Shape,
    cpu=st.integers(0, 4000),
    memory=st.integers(0, 8192),
    gpus=st.integers(0, 4),
    gpu_milli=st.sampled_from([100, 250, 500, 999, WHOLE]),
    models=st.sampled_from([None, frozenset({"T4"}), frozenset({"A10", "T4"}), frozenset({"G2"})]),
).map(lambda s: s._replace(gpu_milli=WHOLE) if s.gpus != 1 else s)
states = st.builds(
    lambda gpus, cpu: HostState("T4", cpu, 16384, tuple(sorted(gpus, reverse=True))),
    st.lists(st.integers(0, WHOLE), max_size=8),
    st.integers(0, 8000),
)


@settings(max_examples=300, deadline=None)
@given(states, st.lists(shapes, min_size=1, max_size=30))
def test_packing_never_takes_more_than_is_free(start: HostState, jobs: list[Shape]) -> None:
    scorer = Scorer(Workload.from_shapes(jobs))
    host = start
    for shape in jobs:
        move = scorer.move(host, shape)
        assert (move is not None) == fits(host, shape)
        if move is None:
            continue
        after = move.after
        assert all(0 <= f <= WHOLE for f in after.gpus)  # a GPU's shares never exceed it
        assert after.cpu >= 0 and after.memory >= 0
        taken = sum(host.gpus) - sum(after.gpus)
        assert taken == shape.gpus * min(shape.gpu_milli, WHOLE)
        host = after


@settings(max_examples=200, deadline=None)
@given(states, st.lists(shapes, min_size=1, max_size=30))
def test_the_fast_fragmentation_is_the_papers_sum(host: HostState, jobs: list[Shape]) -> None:
    workload = Workload.from_shapes(jobs)
    expected = sum(p * stranded(host, shape) for shape, p in workload.classes)
    assert abs(Scorer(workload).fragmentation(host) - expected) < 1e-6
