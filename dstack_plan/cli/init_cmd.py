"""`dstack init`: prepare a project directory."""

from __future__ import annotations

from pathlib import Path

from dstack_plan.cli import common


def init(directory: Path = common.DirArg) -> None:
    """Create the private .dstack/ directory (state, secrets) and keep it out of git."""
    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.workspace import init_workspace

    done = init_workspace(directory)
    lines = [f"{d[0].upper()}{d[1:]}." for d in done] or ["Already initialised: nothing to do."]
    print_lines(lines)
