"""Shared command-line plumbing: options every project command takes, running coroutines."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

if TYPE_CHECKING:
    from dstack_plan.project import Project

T = TypeVar("T")

DirArg = typer.Argument(Path("."), help="Project directory.", show_default=False)
FilesOpt = typer.Option([], "-f", "--file", help="Configuration file (repeatable; '-' = stdin).")
StateOpt = typer.Option(
    None,
    "--state",
    help="State file or s3://bucket/key URL (env DSTACK_STATE; default: .dstack/backend.yml,"
    " else .dstack/state.json).",
)
JsonOpt = typer.Option(False, "--json", help="Machine-readable output.")
TargetOpt = typer.Option([], "--target", help="Limit to ADDRESS and its dependencies.")
ReplaceOpt = typer.Option([], "--replace", help="Replace ADDRESS even if unchanged.")
AllowDestroyOpt = typer.Option(
    [], "--allow-destroy", help="Allow destroying ADDRESS despite lifecycle.prevent_destroy."
)
PruneOpt = typer.Option(
    False,
    "--prune",
    help="Also delete the submitted resources (apply -f, the SDK) the files do not declare.",
)
LockTimeoutOpt = typer.Option(0.0, "--lock-timeout", help="Seconds to wait for the state lock.")


def make_project(
    directory: Path,
    files: list[str],
    state: str | None,
    *,
    run_args: str = "",
    progress: Callable[[str, str], None] | None = None,
) -> Project:
    """The project in `directory`, which must exist: a typo never becomes a new project.
    `progress(address, message)` hears what long operations say as they go."""
    from dstack_plan.project import Project

    require_directory(directory)
    stdin = sys.stdin.read() if "-" in files else None
    return Project(
        directory,
        tuple(files),
        state_path=state,
        stdin=stdin,
        run_args=run_args,
        progress=progress,
    )


def require_directory(directory: Path) -> None:
    """DstackPlanError unless `directory` is an existing directory."""
    from dstack_plan.errors import DstackPlanError

    if not directory.exists():
        raise DstackPlanError(f"no such directory: {directory}")
    if not directory.is_dir():
        raise DstackPlanError(f"not a directory: {directory}")


def require_configuration(project: Project) -> None:
    """DstackPlanError when the project has nothing to plan from: no `-f` file and no
    configuration file in its directory (as Terraform refuses an empty directory).

    Checked before anything else happens, so an empty directory gets no `.dstack/`.
    """
    from dstack_plan.config.discover import has_config_files
    from dstack_plan.errors import DstackPlanError

    if project.files or has_config_files(project.directory):
        return
    message = f"no *.dstack.yml files found in {project.directory}"
    try:
        held = project.backend.read().state.addresses
    except DstackPlanError:  # an unreadable state is not what this error is about
        held = []
    if held:
        message += (
            f" (the state at {project.backend.location} holds {len(held)} resource(s);"
            " `dstack destroy` removes them)"
        )
    raise DstackPlanError(message)


@contextmanager
def no_leftover_state_dir(project: Project) -> Iterator[None]:
    """Remove the local state's directory after the body if the body created it and left it
    empty: taking the operation lock creates `.dstack/`, and an apply that changed nothing
    (or failed before writing state) must not leave one behind."""
    from dstack_plan.state.local import LocalBackend

    backend = project.backend
    parent = backend.path.parent if isinstance(backend, LocalBackend) else None
    existed = parent is None or parent.exists()
    try:
        yield
    finally:
        if not existed and parent is not None:
            try:
                os.rmdir(parent)  # only succeeds while it is empty
            except OSError:
                pass


def run_with(project: Project, work: Callable[[Project], Awaitable[T]]) -> T:
    """Run `work(project)` on a fresh event loop and close the project's connections after."""
    import asyncio

    results: list[T] = []

    async def main() -> None:
        try:
            results.append(await work(project))
        finally:
            await project.close()

    # The result is handed over outside the task: on the way out, asyncio.run formats a repr
    # of its main task (signal.getsignal in Runner.run), result included, which costs seconds
    # for the plan and state of a large project.
    try:
        asyncio.run(main())
    finally:
        _say_if_agent_started(project)
    return results[0]


def _say_if_agent_started(project: Project) -> None:
    """A command that had to start the local agent says so, and where (on stderr)."""
    started = project.local.started
    if started is None:
        return
    from dstack_plan.cli.output import print_lines
    from dstack_plan.plan.lines import styled

    note = (
        f"Started the local agent (pid {started.pid}, data in {started.data_dir}); it keeps "
        "running in the background to look after jobs. Stop it with: "
        "python -m dstack_plan.agent stop"
    )
    print_lines([(styled(note, "dim"),)], stderr=True)
