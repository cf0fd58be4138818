"""`dstack graph` formats: DOT (read back with networkx's pydot reader), Mermaid, JSON."""

from __future__ import annotations

import io
import re

import networkx as nx
import pytest
from networkx.drawing.nx_pydot import read_dot as read_multigraph

from dstack_plan.graph import dag, export
from dstack_plan.graph.dag import NodeInfo
from dstack_plan.plan.model import Action

EDGES = {
    "task.eval": ["task.train", "fleet.pool"],  # fleet.pool is implied through task.train
    "task.train": ["fleet.pool", "volume.data"],
    "service.web": ["fleet.pool"],
    "fleet.pool": [],
    "volume.data": [],
}
# pydot's grammar still calls pyparsing's old names
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pydot.dot_parser")


def read_dot(text: io.StringIO) -> nx.DiGraph[str]:
    return nx.DiGraph(read_multigraph(text))


REDUCED = set(dag.build(EDGES).edges) - {("task.eval", "fleet.pool")}
ACTIONS = {
    "task.eval": "create",
    "task.train": "delete-then-create",
    "service.web": "update",
    "fleet.pool": "no-op",
    "volume.data": "create-then-delete",
}


def planned() -> dag.Graph:
    info = {a: NodeInfo(a.split(".")[0], "local", action) for a, action in ACTIONS.items()}
    return dag.build(EDGES, info)


def test_every_planned_action_has_a_style_and_the_legend_covers_them() -> None:
    assert set(export.STYLES) == {a.value for a in Action}
    assert {s.name for s in export.STYLES.values()} == {s.name for s in export.LEGEND}
    colours = {s.name: s.colour for s in export.LEGEND}
    assert len(set(colours.values())) == 5  # create, update, replace, delete, no-op differ


def test_dot_reads_back_with_networkx_as_the_reduced_graph() -> None:
    text = export.to_dot(dag.build(EDGES))
    read = read_dot(io.StringIO(text))
    assert set(read.nodes) == set(EDGES)
    assert set(read.edges) == REDUCED
    assert text.startswith("digraph dstack {\n  rankdir = LR;\n")


def test_dot_of_a_plan_colours_nodes_by_action_with_a_legend() -> None:
    text = export.to_dot(planned())
    read = read_dot(io.StringIO(text))
    assert set(read.edges) == REDUCED
    for address, action in ACTIONS.items():
        style = export.STYLES[action]
        attributes = read.nodes[address]
        assert attributes["fillcolor"].strip('"') == style.colour
        assert attributes["label"].strip('"') == f"{address}\\n{style.label}"
    # networkx's reader leaves subgraphs out; the legend is one, every style in it
    legend = text[text.index("subgraph cluster_legend") :]
    for style in export.LEGEND:
        assert (
            f'"legend-{style.name}" [label = "{style.label}", fillcolor = "{style.colour}"]'
            in legend
        )


def test_dot_quotes_what_would_break_it() -> None:
    graph = dag.build({'task.a"b': ["task.c\\d"]})
    read = read_dot(io.StringIO(export.to_dot(graph)))
    assert read.number_of_nodes() == 2 and read.number_of_edges() == 1


MERMAID_NODE = re.compile(r'^  (n\d+)\["([^"]*)"\]$')
MERMAID_EDGE = re.compile(r"^  (n\d+) --> (n\d+)$")


def parse_mermaid(text: str) -> tuple[dict[str, str], set[tuple[str, str]], dict[str, str]]:
    """Labels by address, edges by address and class by address, from our own shape; any
    line not of that shape fails the test."""
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    labels: dict[str, str] = {}
    edges: list[tuple[str, str]] = []
    classes: dict[str, str] = {}
    in_legend = False
    for line in lines[1:]:
        if node := MERMAID_NODE.match(line):
            labels[node[1]] = node[2]
        elif edge := MERMAID_EDGE.match(line):
            edges.append((edge[1], edge[2]))
        elif line.startswith("  class "):
            ids, name = line.removeprefix("  class ").split(" ")
            classes.update(dict.fromkeys(ids.split(","), name))
        elif line == "  subgraph legend [Legend]":
            in_legend = True
        elif in_legend:
            assert re.match(r'^    legend_\w+\["[^"]*"\]:::\w+$|^  end$', line), line
        else:
            assert re.match(r"^  classDef \w+ fill:#[0-9a-f]{6},color:#000$", line), line
    address = {node_id: label.split("<br/>")[0] for node_id, label in labels.items()}
    return (
        {address[i]: label for i, label in labels.items()},
        {(address[a], address[b]) for a, b in edges},
        {address[i]: name for i, name in classes.items()},
    )


def test_mermaid_lists_every_node_and_every_reduced_edge() -> None:
    labels, edges, classes = parse_mermaid(export.to_mermaid(dag.build(EDGES)))
    assert labels == {a: a for a in EDGES}
    assert edges == REDUCED
    assert classes == {}


def test_mermaid_of_a_plan_labels_and_classes_nodes_by_action() -> None:
    text = export.to_mermaid(planned())
    labels, edges, classes = parse_mermaid(text)
    assert edges == REDUCED
    assert labels["task.train"] == "task.train<br/>-/+ replace"
    assert labels["volume.data"] == "volume.data<br/>+/- replace"
    assert classes == {a: export.STYLES[action].name for a, action in ACTIONS.items()}
    for style in export.LEGEND:
        assert f"  classDef {style.name} fill:{style.colour},color:#000" in text


def test_mermaid_ids_are_safe_whatever_the_address() -> None:
    graph = dag.build({'task.a"<b>#': ["task.end"], "task.end": []})
    labels, edges, _ = parse_mermaid(export.to_mermaid(graph))
    assert set(labels) == {"task.a#quot;#lt;b#gt;#35;", "task.end"}
    assert len(edges) == 1


def test_json_lists_nodes_with_attributes_and_every_edge() -> None:
    data = export.to_json(planned())
    nodes = {n["address"]: n for n in data["nodes"]}  # type: ignore[attr-defined]
    assert list(nodes) == sorted(EDGES)
    assert nodes["task.train"] == {
        "address": "task.train",
        "kind": "task",
        "provider": "local",
        "action": "delete-then-create",
        "depends_on": ["fleet.pool", "volume.data"],
    }
    # not reduced: the implied edge is there too
    edges = {(e["from"], e["to"]) for e in data["edges"]}  # type: ignore[attr-defined]
    assert edges == REDUCED | {("task.eval", "fleet.pool")}
    unknown = export.to_json(dag.build({"task.x": []}))["nodes"]
    assert unknown == [
        {"address": "task.x", "kind": "task", "provider": None, "action": None, "depends_on": []}
    ]


@pytest.mark.parametrize("render", [export.to_dot, export.to_mermaid])
def test_an_empty_graph_renders(render: object) -> None:
    assert callable(render)
    assert render(dag.build({})).count("\n") >= 1
