"""Cycles among declared resources (what validate reports), found with networkx."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.graph.cycles import MAX_CYCLES, find_cycles, starting_at


def test_each_disjoint_cycle_once_from_its_first_declared_node() -> None:
    edges = {"f": ["a"], "b": ["a"], "a": ["b"], "c": ["d"], "d": ["e"], "e": ["c", "f"]}
    # b is declared before a; f only waits on the a-b cycle (it is on none); e -> f is no cycle
    assert find_cycles(edges) == [["b", "a", "b"], ["c", "d", "e", "c"]]


def test_a_tangle_is_named_by_one_cycle_and_self_loops_count() -> None:
    tangle = {"x": ["y"], "y": ["x", "z"], "z": ["y"], "s": ["s"]}
    assert find_cycles(tangle) == [["x", "y", "x"], ["s", "s"]]
    assert find_cycles({"a": ["b"], "b": []}) == []


def test_at_most_max_cycles_are_reported() -> None:
    edges = {f"n{i}": [f"n{i}"] for i in range(MAX_CYCLES + 5)}
    assert len(find_cycles(edges)) == MAX_CYCLES


def test_starting_at_rotates_a_cycle() -> None:
    assert starting_at(["c", "d", "e", "c"], "e") == ["e", "c", "d", "e"]


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefgh"), st.lists(st.sampled_from("abcdefgh"))))
def test_every_cycle_found_is_a_real_disjoint_cycle(edges: dict[str, list[str]]) -> None:
    cycles = find_cycles(edges)
    seen: set[str] = set()
    for cycle in cycles:
        assert cycle[0] == cycle[-1]
        assert all(b in edges.get(a, []) for a, b in zip(cycle, cycle[1:], strict=False))
        assert not seen & set(cycle[:-1])
        seen |= set(cycle[:-1])
    import graphlib

    try:
        graphlib.TopologicalSorter(edges).prepare()
        acyclic = True
    except graphlib.CycleError:
        acyclic = False
    assert acyclic == (cycles == [])
