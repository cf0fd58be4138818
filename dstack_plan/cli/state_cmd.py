"""`dstack state ...`: look at and repair the state by hand."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.state.backend import StateBackend

app = typer.Typer(
    name="state",
    help="Inspect and edit the state (list, show, rm, pull, unlock).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


def _backend(state: str | None) -> StateBackend:
    # the same resolution as every other command: --state, then $DSTACK_STATE, then ./.dstack
    from pathlib import Path

    return common.make_project(Path("."), [], state).backend


@app.command("list")
def list_(state: str = common.StateOpt, as_json: bool = common.JsonOpt) -> None:
    """Print the address of every resource in state, one per line.

    --json prints a list of {address, kind, name, provider, status, tainted}, by address.
    """
    from dstack_plan.inspect.state_ops import list_resources

    listed = list_resources(_backend(state))
    if as_json:
        sys.stdout.write(json.dumps(listed, indent=2) + "\n")
        return
    for entry in listed:
        sys.stdout.write(f"{entry['address']}\n")


@app.command("show")
def show(
    address: str = typer.Argument(..., help="Resource address, e.g. task.train."),
    state: str = common.StateOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """Print one resource's state entry: `field = value` lines, or with --json the entry as
    stored plus its address ({address, kind, name, provider, spec, spec_hash, attributes,
    status, depends_on, created_at, updated_at, tainted}). State never holds secret values.
    """
    from dstack_plan.inspect.state_ops import show_resource

    entry = show_resource(_backend(state), address)
    if as_json:
        sys.stdout.write(json.dumps(entry, indent=2) + "\n")
        return
    sys.stdout.write("".join(f"{line}\n" for line in _entry_lines(entry)))


def _entry_lines(entry: dict[str, Any]) -> list[str]:
    """`# task.train:` then one `path = value` line per field, nested fields dotted."""
    from dstack_plan.plan.normalize import flatten

    fields = {k: v for k, v in entry.items() if k != "address"}
    flat = flatten(fields)
    width = max((len(path) for path in flat), default=0)
    return [
        f"# {entry['address']}:",
        *(f"{path:<{width}} = {json.dumps(value)}" for path, value in flat.items()),
    ]


@app.command("rm")
def rm(
    addresses: list[str] = typer.Argument(..., help="Resource addresses to forget."),
    state: str = common.StateOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Forget resources without destroying them (they keep existing, unmanaged)."""
    import asyncio

    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.state_ops import forget

    backend = _backend(state)
    removed = asyncio.run(forget(backend, addresses, lock_timeout=lock_timeout))
    print_lines([f"Removed {a}" for a in removed])
    print_lines([f"Successfully removed {len(removed)} resource(s) from the state."])


@app.command("pull")
def pull(state: str = common.StateOpt) -> None:
    """Print the state document as stored (nothing when there is no state yet)."""
    from dstack_plan.inspect.state_ops import pull as pull_state

    text = pull_state(_backend(state))
    if text is not None:
        sys.stdout.write(text)


@app.command("unlock")
def unlock(
    lock_id: str = typer.Argument(..., help="The lock ID from the 'state is locked' error."),
    state: str = common.StateOpt,
) -> None:
    """Force-unlock the state when a holder died without releasing it."""
    from dstack_plan.cli.output import print_lines

    backend = _backend(state)
    backend.unlock(lock_id)
    print_lines([f"Released the state lock {lock_id} on {backend.location}."])
