"""`dstack graph` as a user runs it: the configuration's graph in each format, and a plan's
changes (every action) coloured, after a real apply on the local fleet."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import networkx as nx
import pytest
from networkx.drawing.nx_pydot import read_dot

from dstack_plan.graph.export import STYLES
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.unit.test_graph_export import parse_mermaid

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pydot.dot_parser")


def task(name: str, command: str, extra: str = "") -> str:
    return f"type: task\nname: {name}\ncommands: [{command}]\n{extra}{RESOURCES}"


BEFORE = [
    task("base", "echo base"),
    task("gone", "echo gone", "depends_on: [task.base]\n"),
    task("changed", "echo one", "depends_on: [task.base]\n"),
    task("tuned", "echo tuned", "priority: 1\ndepends_on: [task.changed, task.base]\n"),
]
AFTER = [
    task("base", "echo base"),
    task("changed", "echo two", "depends_on: [task.base]\n"),
    task("tuned", "echo tuned", "priority: 2\ndepends_on: [task.changed, task.base]\n"),
    task("new", "echo new", "depends_on: [task.tuned]\n"),
]
EXPECTED_ACTIONS = {
    "task.base": "no-op",
    "task.gone": "delete",
    "task.changed": "delete-then-create",
    "task.tuned": "update",
    "task.new": "create",
}


def write(project: Path, documents: list[str]) -> None:
    (project / "app.dstack.yml").write_text("---\n".join(documents))


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return str(result.stdout)


def dot_graph(text: str) -> nx.DiGraph[str]:
    return nx.DiGraph(read_dot(io.StringIO(text)))


def test_graph_formats_of_the_configuration(dstack: Dstack, tmp_path: Path) -> None:
    write(tmp_path / "project", BEFORE)
    reduced = {
        ("task.gone", "task.base"),
        ("task.changed", "task.base"),
        ("task.tuned", "task.changed"),  # tuned -> base is implied: not drawn
    }
    dot = dot_graph(ok(dstack("graph")))
    assert set(dot.edges) == reduced and len(dot) == 4
    assert ok(dstack("graph", "--format", "dot")) == ok(dstack("graph"))
    _, edges, classes = parse_mermaid(ok(dstack("graph", "--format", "mermaid")))
    assert edges == reduced and classes == {}
    as_json = json.loads(ok(dstack("graph", "--json")))
    assert as_json == json.loads(ok(dstack("graph", "--format", "json")))
    all_edges = {(e["from"], e["to"]) for e in as_json["edges"]}
    assert all_edges == reduced | {("task.tuned", "task.base")}
    assert {n["provider"] for n in as_json["nodes"]} == {"local"}
    bad = dstack("graph", "--format", "png")
    assert bad.returncode == 1 and "'png' is not one of 'dot', 'mermaid'" in bad.stderr


def test_graph_of_a_plan_colours_every_action(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    write(project, BEFORE)
    ok(dstack("apply", "-y"))
    for name in ("base", "gone", "changed", "tuned"):
        wait_for_status(dstack, f"task.{name}", {"done"})
    write(project, AFTER)

    as_json = json.loads(ok(dstack("graph", "--plan", "--json")))
    assert {n["address"]: n["action"] for n in as_json["nodes"]} == EXPECTED_ACTIONS
    # the delete keeps the edge recorded in state
    assert {"from": "task.gone", "to": "task.base"} in as_json["edges"]

    dot = dot_graph(ok(dstack("graph", "--plan")))
    for address, action in EXPECTED_ACTIONS.items():
        assert dot.nodes[address]["fillcolor"].strip('"') == STYLES[action].colour
    labels, _, classes = parse_mermaid(ok(dstack("graph", "--plan", "--format", "mermaid")))
    assert classes == {a: STYLES[action].name for a, action in EXPECTED_ACTIONS.items()}
    assert labels["task.changed"] == "task.changed<br/>-/+ replace"
    # graph --plan only looks: the state still has what the first apply made
    assert "task.gone" in ok(dstack("state", "list"))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_graphviz_renders_the_plan_graph(dstack: Dstack, tmp_path: Path) -> None:
    write(tmp_path / "project", AFTER)
    text = ok(dstack("graph", "--plan"))
    done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "<svg" in done.stdout and "task.tuned" in done.stdout
