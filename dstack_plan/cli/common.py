"""Shared command-line plumbing: options every project command takes, running coroutines."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

if TYPE_CHECKING:
    from dstack_plan.project import Project

T = TypeVar("T")

DirArg = typer.Argument(Path("."), help="Project directory.", show_default=False)
FilesOpt = typer.Option([], "-f", "--file", help="Configuration file (repeatable; '-' = stdin).")
StateOpt = typer.Option(
    None, "--state", help="State file (default .dstack/state.json; env DSTACK_STATE)."
)
JsonOpt = typer.Option(False, "--json", help="Machine-readable output.")
TargetOpt = typer.Option([], "--target", help="Limit to ADDRESS and its dependencies.")
ReplaceOpt = typer.Option([], "--replace", help="Replace ADDRESS even if unchanged.")
AllowDestroyOpt = typer.Option(
    [], "--allow-destroy", help="Allow destroying ADDRESS despite lifecycle.prevent_destroy."
)
LockTimeoutOpt = typer.Option(0.0, "--lock-timeout", help="Seconds to wait for the state lock.")


def make_project(
    directory: Path, files: list[str], state: str | None, *, run_args: str = ""
) -> Project:
    from dstack_plan.project import Project

    stdin = sys.stdin.read() if "-" in files else None
    return Project(directory, tuple(files), state_path=state, stdin=stdin, run_args=run_args)


def run_with(project: Project, work: Callable[[Project], Awaitable[T]]) -> T:
    """Run `work(project)` on a fresh event loop and close the project's connections after."""
    import asyncio

    from dstack_plan.gcpause import resume_after_startup

    resume_after_startup()
    results: list[T] = []

    async def main() -> None:
        try:
            results.append(await work(project))
        finally:
            await project.close()

    # The result is handed over outside the task: on the way out, asyncio.run formats a repr
    # of its main task (signal.getsignal in Runner.run), result included, which costs seconds
    # for the plan and state of a large project.
    asyncio.run(main())
    return results[0]
