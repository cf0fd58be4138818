"""`dstack graph`: the dependency graph, or a plan's changes, as DOT, Mermaid or JSON."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path

import typer

from dstack_plan.cli import common


class GraphFormat(str, Enum):
    dot = "dot"
    mermaid = "mermaid"
    json = "json"


def graph(
    directory: Path = common.DirArg,
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
    with_plan: bool = typer.Option(
        False, "--plan", help="Graph the planned changes, coloured by action (refreshes state)."
    ),
    output_format: GraphFormat = typer.Option(
        GraphFormat.dot, "--format", help="dot (Graphviz), mermaid, or json.", show_default=True
    ),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
) -> None:
    """Print the dependency graph (`a -> b`: a depends on b).

    From the configuration; when the project declares nothing (the YAML is gone), from the
    edges recorded in state. With --plan, the changes a plan would make, coloured by action
    (create green, update yellow, replace orange, delete red, no-op grey), with a legend.
    DOT and Mermaid show the transitive reduction (no edge that a longer path implies);
    JSON lists every node with kind, provider, action and depends_on, and every edge.
    Render with: dstack graph | dot -Tsvg > graph.svg; or paste --format mermaid into a
    ```mermaid block of a pull-request comment.
    """
    from dstack_plan.graph import export
    from dstack_plan.inspect.graph import plan_graph, project_graph

    project = common.make_project(directory, files, state)
    if with_plan:
        common.require_configuration(project)
        from dstack_plan.cli.output import progress

        with progress("Refreshing state and planning..."):
            result, _ = common.run_with(project, lambda p: p.plan())
        graph = plan_graph(result)
    else:
        graph = project_graph(project)
    if as_json or output_format is GraphFormat.json:
        from dstack_plan.cli.output import print_json

        print_json(export.to_json(graph))
        return
    render = export.to_mermaid if output_format is GraphFormat.mermaid else export.to_dot
    sys.stdout.write(render(graph))
