"""The dependency DAG: creation order in batches, reachability for --target, cycles."""

from __future__ import annotations

import pytest

from dstack_plan.errors import PlanError
from dstack_plan.graph import dag

EDGES = {
    "task.train": ["fleet.pool", "volume.data"],
    "task.eval": ["task.train"],
    "service.web": ["fleet.pool", "gateway.gw"],
    "fleet.pool": [],
}


def test_batches_put_every_dependency_in_an_earlier_batch() -> None:
    graph, batches = dag.build_ordered(EDGES)
    assert batches == [
        ["fleet.pool", "gateway.gw", "volume.data"],  # dependencies that are not keys count too
        ["service.web", "task.train"],
        ["task.eval"],
    ]
    assert dag.batches(graph) == batches
    assert graph.dependents["fleet.pool"] == {"task.train", "service.web"}


def test_targets_take_their_dependencies_or_dependents_along() -> None:
    graph = dag.build(EDGES)
    assert dag.with_dependencies(graph, ["task.eval"]) == {
        "task.eval", "task.train", "fleet.pool", "volume.data",
    }  # fmt: skip
    assert dag.with_dependents(graph, ["fleet.pool"]) == {
        "fleet.pool", "task.train", "task.eval", "service.web",
    }  # fmt: skip
    assert dag.with_dependencies(graph, ["gateway.gw", "volume.data"]) == {
        "gateway.gw", "volume.data",
    }  # fmt: skip


def test_a_resource_that_depends_on_itself_is_a_cycle() -> None:
    with pytest.raises(PlanError, match=r"^dependency cycle: task.a -> task.a$"):
        dag.build({"task.a": ["task.a"]})


def test_a_cycle_is_reported_even_beside_acyclic_parts() -> None:
    edges = {**EDGES, "fleet.pool": ["task.eval"]}
    with pytest.raises(PlanError) as info:
        dag.build(edges)
    cycle = str(info.value).removeprefix("dependency cycle: ").split(" -> ")
    assert cycle[0] == cycle[-1] and len(cycle) == 4
    for dependent, dependency in zip(cycle, cycle[1:], strict=False):
        assert dependency in edges[dependent], (dependent, dependency)


@pytest.mark.parametrize("seed", range(20))
def test_batches_match_graphlibs_generations_on_random_dags(seed: int) -> None:
    import random
    from graphlib import TopologicalSorter

    rng = random.Random(seed)
    names = [f"task.t{i}" for i in range(60)]
    # edges only to earlier names: acyclic, in a shuffled key order
    edges = {n: rng.sample(names[:i], k=min(i, rng.randint(0, 4))) for i, n in enumerate(names)}
    shuffled = dict(rng.sample(sorted(edges.items()), k=len(edges)))
    sorter = TopologicalSorter(shuffled)
    sorter.prepare()
    expected = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        expected.append(ready)
        sorter.done(*ready)
    assert dag.build_ordered(shuffled)[1] == expected
