"""`dstack graph`: the dependency graph in Graphviz DOT."""

from __future__ import annotations

import sys
from pathlib import Path

from dstack_plan.cli import common


def graph(
    directory: Path = common.DirArg,
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
) -> None:
    """Print the dependency graph as DOT (`a -> b`: a depends on b).

    From the configuration; when the project declares nothing (the YAML is gone), from the
    edges recorded in state. Render with: dstack graph | dot -Tsvg > graph.svg
    """
    from dstack_plan.inspect.graph import project_dot

    sys.stdout.write(project_dot(common.make_project(directory, files, state)))
