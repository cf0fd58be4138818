"""Dependency cycles, each named in order: `[a, b, ..., a]` reads "a depends on b ...".

networkx finds them: the strongly connected components say which nodes lie on a cycle at all;
the cycle named is the shortest one through a chosen node of them (a breadth-first search from
it), so the message is as short as it can be and the same on every run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import networkx as nx

MAX_CYCLES = 20
"""Report at most this many cycles at once; fixing those shows the rest."""


def find_cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Cycles in `address -> its dependencies`, each as `[a, b, ..., a]` read "a depends on b".

    Cycles are node-disjoint: after one is found its nodes are set aside and the rest is
    searched again, so every strongly connected tangle is reported once. Each goes through
    the tangle's node that comes first in `edges` (the one declared first).
    """
    import networkx as nx

    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_nodes_from(edges)
    graph.add_edges_from((address, dep) for address, deps in edges.items() for dep in deps)
    order = {address: index for index, address in enumerate(graph)}
    remaining = graph.subgraph(_on_cycles(graph)).copy()
    found: list[list[str]] = []
    while len(found) < MAX_CYCLES:
        candidates = _on_cycles(remaining)
        if not candidates:
            break
        cycle = _cycle_through(remaining, min(candidates, key=order.__getitem__))
        found.append(cycle)
        remaining.remove_nodes_from(cycle)
    return found


def first_cycle(graph: nx.DiGraph[str]) -> list[str]:
    """A shortest cycle through the smallest address on a cycle of `graph` (it has one)."""
    return _cycle_through(graph, min(_on_cycles(graph)))


def cycle_message(cycle: list[str]) -> str:
    """`dependency cycle: a -> b -> a`, the wording every cycle error uses."""
    return "dependency cycle: " + " -> ".join(cycle)


def starting_at(cycle: list[str], first: str) -> list[str]:
    """The same cycle (`[a, b, a]`) read from `first`, one of its nodes."""
    ring = cycle[:-1]
    start = ring.index(first)
    ring = ring[start:] + ring[:start]
    return [*ring, ring[0]]


def _on_cycles(graph: nx.DiGraph[str]) -> set[str]:
    """The nodes that lie on some cycle: strongly connected with another node, or looping.

    find_cycle on a large acyclic part is slow (a DFS over every edge, in Python); the
    components are cheap and leave it only the tangles to walk.
    """
    import networkx as nx

    tangled = {n for c in nx.strongly_connected_components(graph) if len(c) > 1 for n in c}
    return tangled | set(nx.nodes_with_selfloops(graph))


def _cycle_through(graph: nx.DiGraph[str], start: str) -> list[str]:
    """A shortest cycle `[start, ..., start]`: the shortest path from `start` to one of its
    own dependents, closed by the edge back (ties: the dependent that sorts first)."""
    import networkx as nx

    if graph.has_edge(start, start):
        return [start, start]
    paths = nx.single_source_shortest_path(graph, start)
    ends = [node for node in graph.predecessors(start) if node in paths]
    end = min(ends, key=lambda node: (len(paths[node]), node))
    return [*paths[end], start]
