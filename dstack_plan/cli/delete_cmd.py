"""`dstack delete`: destroy the named resources (and what depends on them), as dstack does."""

from __future__ import annotations

from pathlib import Path

import typer

from dstack_plan.cli import common
from dstack_plan.cli.apply_cmd import (
    ApproveOpt,
    InputOpt,
    ParallelismOpt,
    print_progress,
    run_destroy,
)


def delete(
    names: list[str] = typer.Argument(
        None, help="Names (hello) or addresses (task.hello) of resources in state."
    ),
    files: list[str] = typer.Option(
        [], "-f", "--file", help="Delete the resources this configuration file declares."
    ),
    directory: Path = typer.Option(Path("."), "--dir", "-C", help="Project directory."),
    state: str = common.StateOpt,
    allow_destroy: list[str] = common.AllowDestroyOpt,
    auto_approve: bool = ApproveOpt,
    interactive: bool = InputOpt,
    parallelism: int = ParallelismOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Destroy resources by name, submitted or declared, and what depends on them.

    The plan is shown first. A declared resource still in the project's files is created
    again by the next directory apply: delete it from the files instead.
    """
    from dstack_plan.config.loader import load_project
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.inspect.resources import find_entry

    project = common.make_project(directory, [], state, progress=print_progress)
    held = project.backend.read().state
    addresses = [find_entry(held, name).address for name in names or ()]
    if files:
        for resource in load_project(directory, files):
            addresses.append(find_entry(held, resource.address).address)
    if not addresses:
        raise DstackPlanError("name what to delete: dstack delete NAME... or -f FILE")
    run_destroy(
        project,
        tuple(dict.fromkeys(addresses)),
        tuple(allow_destroy),
        approve=auto_approve,
        interactive=interactive,
        parallelism=parallelism,
        lock_timeout=lock_timeout,
        policy_files=[],
    )
