"""The dependency DAG: edges point from a dependency to its dependent (creation order)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import networkx as nx

from dstack_plan.errors import PlanError


def build(edges: Mapping[str, Iterable[str]]) -> nx.DiGraph:
    """A DAG from `address -> its dependencies`; a cycle is a PlanError naming it in order."""
    graph = _graph(edges)
    check_acyclic(graph)
    return graph


def build_ordered(edges: Mapping[str, Iterable[str]]) -> tuple[nx.DiGraph, list[list[str]]]:
    """`build` and its `batches`, with one topological sort for both (what a plan needs)."""
    graph = _graph(edges)
    try:
        return graph, batches(graph)
    except nx.NetworkXUnfeasible:
        check_acyclic(graph)  # raises the PlanError that names the cycle
        raise


def _graph(edges: Mapping[str, Iterable[str]]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for address, deps in edges.items():
        graph.add_node(address)
        for dep in deps:
            graph.add_edge(dep, address)
    return graph


def check_acyclic(graph: nx.DiGraph) -> None:
    if nx.is_directed_acyclic_graph(graph):  # a topological sort: 10x faster than find_cycle
        return
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    # find_cycle gives dependency -> dependent edges; print them as "depends on" order
    path = [edge[1] for edge in cycle][::-1]
    path.append(path[0])
    raise PlanError("dependency cycle: " + " -> ".join(path))


def batches(graph: nx.DiGraph) -> list[list[str]]:
    """Addresses in dependency order, grouped so each batch depends only on earlier ones."""
    return [sorted(generation) for generation in nx.topological_generations(graph)]


def with_dependencies(graph: nx.DiGraph, targets: Iterable[str]) -> set[str]:
    """The targets and everything they (transitively) depend on."""
    selected: set[str] = set()
    for target in targets:
        selected.add(target)
        selected |= nx.ancestors(graph, target)
    return selected


def with_dependents(graph: nx.DiGraph, targets: Iterable[str]) -> set[str]:
    """The targets and everything that (transitively) depends on them."""
    selected: set[str] = set()
    for target in targets:
        selected.add(target)
        selected |= nx.descendants(graph, target)
    return selected


def to_dot(graph: nx.DiGraph) -> str:
    """Graphviz DOT; an edge `a -> b` reads "a depends on b", as in `terraform graph`."""
    lines = ["digraph dstack {", "  rankdir = LR;"]
    for node in sorted(graph.nodes):
        lines.append(f'  "{node}";')
    for dep, dependent in sorted(graph.edges):
        lines.append(f'  "{dependent}" -> "{dep}";')
    lines.append("}")
    return "\n".join(lines) + "\n"
