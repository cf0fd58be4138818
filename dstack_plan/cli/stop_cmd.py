"""`dstack stop`: stop a run's jobs and record it in state."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dstack_plan.cli import common


def stop(
    run: str = typer.Argument(..., help="Run name (hello) or address (task.hello)."),
    directory: Path = common.DirArg,
    state: str = common.StateOpt,
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    abort: bool = typer.Option(
        False, "-x", "--abort", help="Kill at once instead of a graceful stop (stop_duration)."
    ),
) -> None:
    """Stop a run: SIGTERM, then SIGKILL after its stop_duration (or at once with --abort).

    The run stays in state, finished; its logs stay readable. Without a terminal on stdin,
    -y is required.
    """
    from dstack_plan.cli.output import print_lines
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.inspect.runs import find_run
    from dstack_plan.inspect.stop import stop_run

    project = common.make_project(directory, [], state)
    address = find_run(project.backend.read().state, run).address
    if not yes:
        if not sys.stdin.isatty():
            raise DstackPlanError(f"stopping {address} needs confirmation: pass -y")
        if not typer.confirm(f"{'Abort' if abort else 'Stop'} the run {address}?"):
            print_lines(["Cancelled."])
            raise typer.Exit(1)
    result = common.run_with(project, lambda p: stop_run(p, address, abort=abort))
    if result.stopped:
        verb = "Aborted" if abort else "Stopped"
        count = len(result.stopped)
        print_lines(
            [f"{verb} {address} ({count} job{'s' if count != 1 else ''}): {result.status}"]
        )
    elif result.retry_cancelled:
        print_lines([f"{address}: its retry is cancelled: {result.status}"])
    else:
        print_lines([f"{address} had already finished: {result.status}"])
