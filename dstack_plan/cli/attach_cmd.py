"""`dstack attach`: a run's ports forwarded to this machine, and its logs, until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.inspect.ports import PortOverride
    from dstack_plan.project import Project


def attach(
    run: str = typer.Argument(..., help="Run name (web) or address (service.web)."),
    directory: Path = common.DirArg,
    state: str = common.StateOpt,
    port: list[str] = typer.Option(
        [],
        "-p",
        "--port",
        help="LOCAL:CONTAINER: forward the job's CONTAINER port to LOCAL here (repeatable; "
        "default: the container port when free, else any free port).",
    ),
    no_logs: bool = typer.Option(False, "--no-logs", help="Forward the ports only."),
) -> None:
    """Forward a run's ports (a service's `port`, a task's `ports`) from its hosts to
    127.0.0.1 here through SSH, print the local URLs, and stream its logs until it ends.

    Ctrl-C detaches: the forwards close, the jobs keep running.
    """
    from dstack_plan.inspect.ports import PortOverride

    overrides = [PortOverride.parse(p) for p in port]
    project = common.make_project(directory, [], state)
    ok = common.run_with(project, lambda p: _attach(p, run, overrides, logs=not no_logs))
    if not ok:
        raise typer.Exit(1)


async def _attach(
    project: Project, ref: str, overrides: list[PortOverride], *, logs: bool
) -> bool:
    from dstack_plan.cli.attach import attach_runs
    from dstack_plan.inspect.runs import find_run

    run = find_run(project.backend.read().state, ref)
    return await attach_runs(project, [run.address], ports=overrides, logs=logs, explain=True)
