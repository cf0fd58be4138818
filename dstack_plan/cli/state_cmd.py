"""`dstack state ...`: look at and repair the state by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.state.backend import StateBackend

app = typer.Typer(
    name="state",
    help="Inspect and edit the state (list, show, pull, push, rm, mv, unlock, migrate, history).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


def _backend(state: str | None) -> StateBackend:
    # the same resolution as every other command (state/select.py): --state, $DSTACK_STATE,
    # .dstack/backend.yml, then .dstack/state.json of the working directory
    from dstack_plan.state.select import open_backend

    return open_backend(Path("."), state)


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
    version: str = typer.Option(
        None, "--version", help="A stored version's ID (from `state history`)."
    ),
) -> None:
    """Print one resource's state entry: `field = value` lines, or with --json the entry as
    stored plus its address ({address, kind, name, provider, spec, spec_hash, attributes,
    status, depends_on, created_at, updated_at, tainted}). State never holds secret values.
    """
    from dstack_plan.inspect.state_ops import show_resource

    entry = show_resource(_backend(state), address, version=version)
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
    """Forget resources without destroying them (they keep existing, unmanaged); they are
    dropped from other resources' depends_on too."""
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


@app.command("mv")
def mv(
    source: str = typer.Argument(..., help="The address in state now, e.g. task.train."),
    target: str = typer.Argument(..., help="The new address, of the same kind."),
    state: str = common.StateOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Give a resource another address in state (rename it in the YAML too); every
    depends_on naming it follows."""
    import asyncio

    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.state_edit import move

    asyncio.run(move(_backend(state), source, target, lock_timeout=lock_timeout))
    print_lines([f"Moved {source} to {target}."])


@app.command("push")
def push(
    file: str = typer.Argument(..., help="A state file (as `state pull` prints); '-' = stdin."),
    force: bool = typer.Option(
        False, "--force", help="Write even an older serial or another lineage."
    ),
    state: str = common.StateOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Replace the stored state with FILE. Refused, unless --force, when FILE is of another
    lineage, has an older serial, or the same serial with other content."""
    import asyncio

    from dstack_plan.cli.output import print_lines
    from dstack_plan.errors import StateError
    from dstack_plan.inspect.state_edit import push as push_state
    from dstack_plan.state.codec import parse_state

    if file == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = Path(file).read_bytes()
        except OSError as err:
            raise StateError(f"{file}: cannot read: {err.strerror}") from None
    backend = _backend(state)
    pushed = parse_state(data, "<stdin>" if file == "-" else file)
    done = asyncio.run(push_state(backend, pushed, force=force, lock_timeout=lock_timeout))
    if not done.written:
        print_lines([f"The state at {backend.location} is already this state: nothing pushed."])
        return
    after = done.snapshot.state
    print_lines([f"Pushed serial {after.serial} (lineage {after.lineage}) to {backend.location}."])


@app.command("migrate")
def migrate(
    to: str = typer.Option(
        ..., "--to", help="The new place: s3://bucket/key?region=... or a path."
    ),
    state: str = common.StateOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Copy the state to another backend keeping its lineage and serial, then write
    .dstack/backend.yml so the project uses it. The old state is left as it was."""
    import asyncio
    import os

    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.state_migrate import migrate as migrate_state
    from dstack_plan.state.local import STATE_ENV
    from dstack_plan.state.select import backend_at, parse_where

    project = Path(".")
    source = _backend(state)
    where = parse_where(to)
    target = backend_at(where)
    done = asyncio.run(migrate_state(source, target, where, project, lock_timeout=lock_timeout))
    moved = done.snapshot.state
    lines = [
        f"Copied serial {moved.serial} (lineage {moved.lineage}) to {target.location}."
        if done.written
        else f"{target.location} already holds serial {moved.serial}: nothing to copy.",
        f"Wrote {done.config_file}: this project now uses {target.location}.",
        f"The state at {source.location} is left as it was.",
    ]
    if state or os.environ.get(STATE_ENV):
        lines.append(f"Note: --state / ${STATE_ENV} still override {done.config_file}.")
    print_lines(lines)


@app.command("history")
def history(state: str = common.StateOpt, as_json: bool = common.JsonOpt) -> None:
    """The stored versions of the state, newest first: ID, serial, when written, current.

    --json prints a list of {id, serial, lineage, written_at, current}. `state show ADDR
    --version ID` shows a resource as it was in one of them.
    """
    from dstack_plan.inspect.state_ops import history as versions

    listed = versions(_backend(state))
    if as_json:
        sys.stdout.write(json.dumps(listed, indent=2) + "\n")
        return
    rows = [
        (v["id"], str(v["serial"]), v["written_at"] or "-", "current" if v["current"] else "")
        for v in listed
    ]
    table = [("ID", "SERIAL", "WRITTEN", ""), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        sys.stdout.write("  ".join([*cells, row[3]]).rstrip() + "\n")
