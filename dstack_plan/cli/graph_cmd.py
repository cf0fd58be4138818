"""`dstack graph`: the dependency graph in Graphviz DOT."""

from __future__ import annotations

import sys
from pathlib import Path

from dstack_plan.cli import common


def graph(
    directory: Path = common.DirArg,
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """Print the dependency graph as DOT (`a -> b`: a depends on b).

    From the configuration; when the project declares nothing (the YAML is gone), from the
    edges recorded in state. Render with: dstack graph | dot -Tsvg > graph.svg
    --json prints [{address, depends_on: [address, ...]}], by address.
    """
    from dstack_plan.inspect.graph import project_dot, project_graph_json

    project = common.make_project(directory, files, state)
    if as_json:
        from dstack_plan.cli.output import print_json

        print_json(project_graph_json(project))
        return
    sys.stdout.write(project_dot(project))
