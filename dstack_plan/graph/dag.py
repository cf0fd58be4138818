"""The dependency DAG: a `networkx.DiGraph` of resource addresses.

Convention, kept everywhere (here, the DOT / Mermaid / JSON output, `terraform graph`): an edge
`a -> b` reads "a depends on b". So b is created before a, a is destroyed before b; the
descendants of a node are what it depends on, its ancestors what depends on it.

Nodes carry what is known of them as attributes: `kind`, `provider` and, in a graph of a
plan, the planned `action` (see `NodeInfo`).

networkx is imported inside the functions: `dstack ps`, `logs` and the like import this module
through `Project` and never need a graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from dstack_plan.errors import PlanError
from dstack_plan.graph.cycles import cycle_message, first_cycle

if TYPE_CHECKING:
    import networkx as nx

    Graph = nx.DiGraph[str]


class NodeInfo(NamedTuple):
    """What a node of the graph is, as far as it is known (its networkx attributes)."""

    kind: str
    provider: str | None = None
    action: str | None = None
    """The planned action (`Action.value`), in a graph of a plan."""


def build(edges: Mapping[str, Iterable[str]], info: Mapping[str, NodeInfo] | None = None) -> Graph:
    """A DAG from `address -> its dependencies`; a cycle is a PlanError naming it in order.

    A dependency that is not a key itself becomes a node without dependencies. `info` gives
    node attributes; a node without any still has its `kind` (the address's first part).
    """
    return build_ordered(edges, info)[0]


def build_ordered(
    edges: Mapping[str, Iterable[str]], info: Mapping[str, NodeInfo] | None = None
) -> tuple[Graph, list[list[str]]]:
    """`build` and its `batches` (what a plan needs)."""
    import networkx as nx

    graph: Graph = nx.DiGraph()
    known = info or {}
    graph.add_nodes_from((a, _attributes(a, known.get(a))) for a in edges)
    graph.add_edges_from((address, dep) for address, deps in edges.items() for dep in deps)
    if len(graph) > len(edges):  # dependencies that are no keys: still say what they are
        for address in graph.nodes - edges.keys():
            graph.nodes[address].update(_attributes(address, known.get(address)))
    return graph, batches(graph)


def _attributes(address: str, info: NodeInfo | None) -> dict[str, str]:
    if info is None:
        return {"kind": address.partition(".")[0]}
    attributes = {"kind": info.kind}
    if info.provider is not None:
        attributes["provider"] = info.provider
    if info.action is not None:
        attributes["action"] = info.action
    return attributes


def node_info(graph: Graph, address: str) -> NodeInfo:
    """The attributes of `address` as a NodeInfo."""
    attributes = graph.nodes[address]
    return NodeInfo(attributes["kind"], attributes.get("provider"), attributes.get("action"))


def batches(graph: Graph) -> list[list[str]]:
    """Creation order: addresses grouped so each batch depends only on earlier ones, sorted.

    The topological generations of the reversed graph (edges point at dependencies).
    """
    return _generations(graph.reverse(copy=False), graph)


def destroy_batches(graph: Graph) -> list[list[str]]:
    """Destroy order: dependents first; each batch is depended on only by earlier ones."""
    return _generations(graph, graph)


def _generations(directed: Graph, graph: Graph) -> list[list[str]]:
    import networkx as nx

    try:
        return [sorted(generation) for generation in nx.topological_generations(directed)]
    except nx.NetworkXUnfeasible:
        raise PlanError(cycle_message(first_cycle(graph))) from None


def with_dependencies(graph: Graph, targets: Iterable[str]) -> set[str]:
    """The targets and everything they (transitively) depend on: their descendants.

    (As `terraform plan -target`: a target brings its dependencies along.) One breadth-first
    search from all the targets at once, not one `nx.descendants` per target.
    """
    return _reachable(graph, targets)


def with_dependents(graph: Graph, targets: Iterable[str]) -> set[str]:
    """The targets and everything that (transitively) depends on them: their ancestors
    (what `destroy -target` must destroy first)."""
    return _reachable(graph.reverse(copy=False), targets)


def _reachable(graph: Graph, targets: Iterable[str]) -> set[str]:
    import networkx as nx

    sources = list(targets)
    if not sources:
        return set()
    return {node for layer in nx.bfs_layers(graph, sources) for node in layer}


def reduced(graph: Graph) -> Graph:
    """The transitive reduction, with the node attributes: the fewest edges that keep every
    dependency (for display: `a -> b -> c` without the implied `a -> c`)."""
    import networkx as nx

    reduction: Graph = nx.transitive_reduction(graph)
    reduction.add_nodes_from(graph.nodes(data=True))
    return reduction
