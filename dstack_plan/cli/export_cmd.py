"""`dstack export ...`: share this project's fleets and gateways with other projects."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.state.exports import Importer
    from dstack_plan.state.model import State

app = typer.Typer(
    name="export",
    help="Share fleets and gateways with other projects (create, update, delete, list); "
    "alone, as `dstack export list`.",
    add_completion=False,
    rich_markup_mode=None,
)

NameArg = typer.Argument(..., help="The export's name.")
IMPORTER_HELP = (
    "An importer project, repeatable: NAME=LOCATION (where its state lives: a path or an "
    "s3:// URL), or NAME when .dstack/projects.yml names it."
)


def _importers(given: list[str]) -> list[Importer]:
    from dstack_plan.sharing.exports import importer_of
    from dstack_plan.sharing.projects_file import load_projects

    directory = Path(".")
    projects = load_projects(directory)
    return [importer_of(g, directory, projects) for g in given]


def _edit(state: str | None, change: Callable[[State], State], operation: str, said: str,
          lock_timeout: float) -> None:  # fmt: skip
    import asyncio

    from dstack_plan.cli.output import print_lines
    from dstack_plan.sharing.exports import edit
    from dstack_plan.state.select import open_backend

    backend = open_backend(Path("."), state)
    asyncio.run(edit(backend, change, operation, lock_timeout=lock_timeout))
    print_lines([f"{said} ({backend.location})"])


@app.command("create")
def create(
    name: str = NameArg,
    fleet: list[str] = typer.Option([], "--fleet", help="A fleet to share (repeatable)."),
    gateway: list[str] = typer.Option([], "--gateway", help="A gateway to share (repeatable)."),
    importer: list[str] = typer.Option([], "--importer", help=IMPORTER_HELP),
    state: str = common.StateOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Share fleets and gateways with importer projects.

    `dstack export create gpu-share --fleet gpu --importer ml=s3://bucket/ml/state.json`.
    The importer's runs then name `fleets: [PROJECT/gpu]` (this project's name: its
    directory's); the importer lists this project's state in its .dstack/projects.yml.
    """
    from dstack_plan.sharing.exports import created

    importers = _importers(importer)
    _edit(
        state,
        lambda s: created(s, name, fleet, gateway, importers),
        "export create",
        f"Created export {name}",
        lock_timeout,
    )


@app.command("update")
def update(
    name: str = NameArg,
    add_fleet: list[str] = typer.Option([], "--add-fleet", help="Share this fleet too."),
    remove_fleet: list[str] = typer.Option([], "--remove-fleet", help="Stop sharing it."),
    add_gateway: list[str] = typer.Option([], "--add-gateway", help="Share this gateway too."),
    remove_gateway: list[str] = typer.Option([], "--remove-gateway", help="Stop sharing it."),
    add_importer: list[str] = typer.Option([], "--add-importer", help=IMPORTER_HELP),
    remove_importer: list[str] = typer.Option(
        [], "--remove-importer", help="An importer project's name: its new placements are refused."
    ),
    state: str = common.StateOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Change what an export shares and with whom. What runs keeps running; removed
    fleets and importers get no new jobs."""
    from dstack_plan.sharing.exports import updated

    importers = _importers(add_importer)
    _edit(
        state,
        lambda s: updated(
            s,
            name,
            add_fleets=add_fleet,
            remove_fleets=remove_fleet,
            add_gateways=add_gateway,
            remove_gateways=remove_gateway,
            add_importers=importers,
            remove_importers=remove_importer,
        ),
        "export update",
        f"Updated export {name}",
        lock_timeout,
    )


@app.command("delete")
def delete(
    name: str = NameArg,
    state: str = common.StateOpt,
    lock_timeout: float = common.LockTimeoutOpt,
) -> None:
    """Revoke an export: its importers' jobs keep running, new ones are refused."""
    from dstack_plan.sharing.exports import deleted

    _edit(
        state, lambda s: deleted(s, name), "export delete", f"Deleted export {name}", lock_timeout
    )


@app.callback(invoke_without_command=True)
def bare(ctx: typer.Context, state: str = common.StateOpt, as_json: bool = common.JsonOpt) -> None:
    """`dstack export [--json]` alone is `dstack export list`, as in dstack."""
    common.run_bare_group(ctx, lambda: list_(state, as_json))


@app.command("list")
def list_(state: str = common.StateOpt, as_json: bool = common.JsonOpt) -> None:
    """The project's exports: what each shares and with whom (--json: a list of {name,
    fleets, gateways, importers: [{project, state}]})."""
    from dstack_plan.cli.output import print_json, print_lines
    from dstack_plan.state.select import open_backend

    exports = open_backend(Path("."), state).read().state.exports
    if as_json:
        print_json([exports[n].model_dump(mode="json") for n in sorted(exports)])
        return
    if not exports:
        print_lines(["No exports."])
        return
    lines = ["EXPORT  FLEETS  GATEWAYS  IMPORTERS"]
    for name in sorted(exports):
        e = exports[name]
        importers = ", ".join(f"{i.project} ({i.state})" for i in e.importers)
        lines.append(
            f"{name}  {', '.join(e.fleets) or '-'}  {', '.join(e.gateways) or '-'}  {importers}"
        )
    print_lines(lines)
