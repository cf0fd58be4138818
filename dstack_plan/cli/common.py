"""Shared command-line plumbing: options every project command takes, running coroutines,
Ctrl-C before anything changed (`nothing_changed_on_interrupt`)."""

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


def run_bare_group(ctx: typer.Context, default: Callable[[], None]) -> None:
    """The callback of a group that runs bare, as dstack's do: alone (`dstack fleet`), it runs
    `default`, one of its subcommands (`list`) given the group's options, which are that
    subcommand's (`dstack fleet --json` is `dstack fleet list --json`). Given before another
    subcommand they would be dropped without a word (`dstack fleet --json probe F`): a usage
    error says where they go instead."""
    if ctx.invoked_subcommand is None:
        default()
        return
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if source is not None and source.name == "COMMANDLINE":
            from dstack_plan.cli.app import UsageError

            option, path = param.opts[0], ctx.command_path
            raise UsageError(
                f"{option} before a subcommand is an option of bare `{path}`; give it after "
                f"the subcommand: {path} {ctx.invoked_subcommand} ... {option}",
                ctx,
            )


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


INTERRUPTED_UNCHANGED = "Interrupted: nothing was changed."


@contextmanager
def nothing_changed_on_interrupt(changing: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Ctrl-C in the body while it only reads (refreshes, plans, asks): say on stderr that
    nothing was changed and exit 130. Once `changing()` is true the interrupt goes on as it
    would (an apply handles its own, see `apply/interrupt.py`)."""
    try:
        yield
    except KeyboardInterrupt:
        if changing():
            raise
        sys.stderr.write(f"{INTERRUPTED_UNCHANGED}\n")
        raise typer.Exit(130) from None


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
    from dstack_plan.cli.output import notice

    note = (
        f"Started the local agent (pid {started.pid}, data in {started.data_dir}); it keeps "
        "running in the background to look after jobs. Stop it with: dstack agent stop"
    )
    notice(note, event="agent_started")
