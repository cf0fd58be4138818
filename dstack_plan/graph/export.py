"""The dependency graph as Graphviz DOT, Mermaid (for pull-request comments) and JSON.

Every format draws `a -> b` for "a depends on b" (as `terraform graph` does). DOT and Mermaid
draw the transitive reduction (`dag.reduced`): the implied edges only clutter a picture. JSON
lists every edge. A graph whose nodes carry an `action` (a graph of a plan) is coloured by it,
with a legend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from dstack_plan.graph.dag import node_info, reduced

if TYPE_CHECKING:
    from dstack_plan.graph.dag import Graph


class Style(NamedTuple):
    """How one planned action is drawn."""

    name: str
    """Its class name (Mermaid) and legend key."""
    label: str
    """What the node says under its address (Terraform's symbol and a word)."""
    colour: str
    """Fill colour."""


STYLES = {
    "create": Style("create", "+ create", "#7bd88f"),
    "update": Style("update", "~ update", "#ffe066"),
    "delete-then-create": Style("replace", "-/+ replace", "#ffa94d"),
    "create-then-delete": Style("replace", "+/- replace", "#ffa94d"),
    "delete": Style("delete", "- delete", "#ff6b6b"),
    "no-op": Style("noop", "no-op", "#dee2e6"),
}
"""Planned action (`plan.model.Action` values) -> style."""
LEGEND = [STYLES[a] for a in ("create", "update", "delete-then-create", "delete", "no-op")]


def _styled(graph: Graph) -> bool:
    return any("action" in attributes for _, attributes in graph.nodes(data=True))


def _style(graph: Graph, address: str) -> Style:
    return STYLES[node_info(graph, address).action or "no-op"]


def _edges(graph: Graph) -> list[tuple[str, str]]:
    """`(a, b)` for "a depends on b", sorted by dependency then dependent (as drawn so far)."""
    return sorted(graph.edges, key=lambda edge: (edge[1], edge[0]))


def to_dot(graph: Graph) -> str:
    """Graphviz DOT of the transitive reduction; render with `dot -Tsvg`."""
    shown = reduced(graph)
    styled = _styled(graph)
    lines = ["digraph dstack {", "  rankdir = LR;"]
    if styled:
        lines.append('  node [shape = box, style = "rounded,filled"];')
    for address in sorted(shown):
        if styled:
            style = _style(graph, address)
            label = _dot_quote(f"{address}\n{style.label}")
            fill = _dot_quote(style.colour)
            lines.append(f"  {_dot_quote(address)} [label = {label}, fillcolor = {fill}];")
        else:
            lines.append(f"  {_dot_quote(address)};")
    lines.extend(f"  {_dot_quote(a)} -> {_dot_quote(b)};" for a, b in _edges(shown))
    if styled:
        lines += ["  subgraph cluster_legend {", '    label = "Legend";']
        lines.extend(
            f'    "legend-{s.name}" [label = {_dot_quote(s.label)}, fillcolor = "{s.colour}"];'
            for s in LEGEND
        )
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_quote(text: str) -> str:
    """A DOT quoted ID: backslashes and quotes escaped, newlines as DOT's `\\n`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def to_mermaid(graph: Graph) -> str:
    """A Mermaid flowchart of the transitive reduction (GitHub renders it in a ```mermaid
    block). Node ids are `n0, n1, ...` in address order: addresses may hold characters that
    Mermaid reads as syntax; the address is the label."""
    shown = reduced(graph)
    styled = _styled(graph)
    ids = {address: f"n{index}" for index, address in enumerate(sorted(shown))}
    lines = ["flowchart LR"]
    for address, node_id in ids.items():
        text = _mermaid_text(address)
        if styled:
            text += "<br/>" + _mermaid_text(_style(graph, address).label)
        lines.append(f'  {node_id}["{text}"]')
    lines.extend(f"  {ids[a]} --> {ids[b]}" for a, b in _edges(shown))
    if styled:
        lines.extend(f"  classDef {s.name} fill:{s.colour},color:#000" for s in LEGEND)
        by_class: dict[str, list[str]] = {}
        for address, node_id in ids.items():
            by_class.setdefault(_style(graph, address).name, []).append(node_id)
        lines.extend(f"  class {','.join(nodes)} {name}" for name, nodes in by_class.items())
        lines.append("  subgraph legend [Legend]")
        lines.extend(f'    legend_{s.name}["{_mermaid_text(s.label)}"]:::{s.name}' for s in LEGEND)
        lines.append("  end")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    """Text inside a quoted Mermaid label: its own syntax characters as entity codes."""
    codes = {'"': "#quot;", "<": "#lt;", ">": "#gt;", "#": "#35;"}
    return "".join(codes.get(ch, ch) for ch in text)


def to_json(graph: Graph) -> dict[str, object]:
    """Every node with its attributes and dependencies, and every edge (not reduced):
    `{"nodes": [{address, kind, provider, action, depends_on}], "edges": [{from, to}]}`,
    by address; an edge reads "from depends on to"; unknown attributes are null."""
    nodes = []
    for address in sorted(graph):
        info = node_info(graph, address)
        nodes.append(
            {
                "address": address,
                "kind": info.kind,
                "provider": info.provider,
                "action": info.action,
                "depends_on": sorted(graph.successors(address)),
            }
        )
    edges = [{"from": a, "to": b} for a, b in sorted(graph.edges)]
    return {"nodes": nodes, "edges": edges}
