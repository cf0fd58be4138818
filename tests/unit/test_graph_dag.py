"""The dependency DAG on networkx: creation and destroy order, --target closures, cycles."""

from __future__ import annotations

import random
from graphlib import TopologicalSorter

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.errors import PlanError
from dstack_plan.graph import dag
from dstack_plan.graph.dag import NodeInfo

EDGES = {
    "task.train": ["fleet.pool", "volume.data"],
    "task.eval": ["task.train"],
    "service.web": ["fleet.pool", "gateway.gw"],
    "fleet.pool": [],
}


def test_the_graph_is_a_networkx_digraph_whose_edges_point_at_dependencies() -> None:
    graph = dag.build(EDGES)
    assert isinstance(graph, nx.DiGraph)
    assert graph.has_edge("task.eval", "task.train")  # a -> b: a depends on b
    assert not graph.has_edge("task.train", "task.eval")
    assert set(graph.successors("fleet.pool")) == set()
    assert set(graph.predecessors("fleet.pool")) == {"task.train", "service.web"}


def test_nodes_carry_kind_provider_and_action_when_known() -> None:
    info = {
        "task.train": NodeInfo("task", "aws", "create"),
        "fleet.pool": NodeInfo("fleet", "aws"),
    }
    graph = dag.build(EDGES, info)
    assert graph.nodes["task.train"] == {"kind": "task", "provider": "aws", "action": "create"}
    assert graph.nodes["fleet.pool"] == {"kind": "fleet", "provider": "aws"}
    # unknown: the kind is still there, from the address (also for dependencies-only nodes)
    assert graph.nodes["task.eval"] == {"kind": "task"}
    assert dag.node_info(graph, "gateway.gw") == NodeInfo("gateway")


def test_batches_put_every_dependency_in_an_earlier_batch() -> None:
    graph, batches = dag.build_ordered(EDGES)
    assert batches == [
        ["fleet.pool", "gateway.gw", "volume.data"],  # dependencies that are not keys count too
        ["service.web", "task.train"],
        ["task.eval"],
    ]
    assert dag.batches(graph) == batches


def test_destroy_batches_put_dependents_first() -> None:
    assert dag.destroy_batches(dag.build(EDGES)) == [
        ["service.web", "task.eval"],
        ["gateway.gw", "task.train"],
        ["fleet.pool", "volume.data"],
    ]


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
    assert dag.with_dependencies(graph, []) == set()


def test_a_resource_that_depends_on_itself_is_a_cycle() -> None:
    with pytest.raises(PlanError, match=r"^dependency cycle: task.a -> task.a$"):
        dag.build({"task.a": ["task.a"]})


def test_a_cycle_is_reported_even_beside_acyclic_parts() -> None:
    edges = {**EDGES, "fleet.pool": ["task.eval"]}
    with pytest.raises(PlanError) as info:
        dag.build(edges)
    # in order, from the smallest address on it
    assert (
        str(info.value) == "dependency cycle: fleet.pool -> task.eval -> task.train -> fleet.pool"
    )


def test_the_cycle_named_is_the_shortest_through_its_first_node() -> None:
    # task.a is on a long cycle (a b c d a) and a short one (a d a)
    edges = {"task.a": ["task.b", "task.d"], "task.b": ["task.c"], "task.c": ["task.d"]}
    edges["task.d"] = ["task.a"]
    with pytest.raises(PlanError, match=r"^dependency cycle: task.a -> task.d -> task.a$"):
        dag.build(edges)


def test_reduced_drops_implied_edges_and_keeps_attributes() -> None:
    graph = dag.build({**EDGES, "task.eval": ["task.train", "fleet.pool"]})
    shown = dag.reduced(graph)
    assert not shown.has_edge("task.eval", "fleet.pool")  # eval -> train -> pool implies it
    assert set(shown.edges) == set(graph.edges) - {("task.eval", "fleet.pool")}
    assert dict(shown.nodes(data=True)) == dict(graph.nodes(data=True))


def random_dag(seed: int, size: int = 60) -> dict[str, list[str]]:
    """Edges only to earlier names (acyclic), in a shuffled key order."""
    rng = random.Random(seed)
    names = [f"task.t{i}" for i in range(size)]
    edges = {n: rng.sample(names[:i], k=min(i, rng.randint(0, 4))) for i, n in enumerate(names)}
    return dict(rng.sample(sorted(edges.items()), k=len(edges)))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_batches_match_graphlibs_generations_on_random_dags(seed: int) -> None:
    edges = random_dag(seed)
    sorter = TopologicalSorter(edges)
    sorter.prepare()
    expected = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        expected.append(ready)
        sorter.done(*ready)
    assert dag.build_ordered(edges)[1] == expected


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(0, 59), max_size=5))
def test_closures_are_the_union_of_descendants_or_ancestors(seed: int, picks: list[int]) -> None:
    graph = dag.build(random_dag(seed))
    targets = [f"task.t{i}" for i in picks]
    down = set(targets).union(*(nx.descendants(graph, t) for t in targets))
    up = set(targets).union(*(nx.ancestors(graph, t) for t in targets))
    assert dag.with_dependencies(graph, targets) == down
    assert dag.with_dependents(graph, targets) == up
    # and destroying in destroy order never removes something before its dependents
    position = {a: i for i, batch in enumerate(dag.destroy_batches(graph)) for a in batch}
    assert all(position[a] < position[b] for a, b in graph.edges)
