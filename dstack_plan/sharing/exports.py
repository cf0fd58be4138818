"""`dstack export create | update | delete | list`: the owner's exports, edited in its state.

Each edit is a pure function of the state (`created`, `updated`, `deleted`) run by `edit`
under the operation lock (an apply must not write the state at the same time) as one
compare-and-swap commit. Exports name fleets and gateways the state holds, and importer
projects with where their states live (`Importer.state`): given on the command line as
`NAME=LOCATION`, or as `NAME` when this project's `.dstack/projects.yml` names it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from dstack_plan.clock import Clock
from dstack_plan.config.project_name import check_project_name
from dstack_plan.errors import DstackPlanError
from dstack_plan.sharing.projects_file import ProjectsFile
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.commit import commit_async
from dstack_plan.state.exports import Export, Importer
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.model import State
from dstack_plan.state.select import S3_SCHEME, describe, parse_where


def importer_of(given: str, project_dir: Path, projects: ProjectsFile) -> Importer:
    """`NAME=LOCATION` or `NAME` (its location from `.dstack/projects.yml`) as an Importer;
    a relative path is made absolute against the project, so the owner's watch finds it
    from anywhere."""
    name, eq, location = given.partition("=")
    try:
        check_project_name(name)
    except ValueError as e:
        raise DstackPlanError(f"--importer {given}: {e}") from None
    if not eq:
        known = projects.projects.get(name)
        if known is None:
            raise DstackPlanError(
                f"--importer {name}: where is its state? Give it as {name}=LOCATION (a path or "
                f"an s3:// URL), or name the project in .dstack/projects.yml"
            )
        location = known.state
    if not location:
        raise DstackPlanError(f"--importer {given}: the state location is empty")
    try:
        where = describe(parse_where(location, project_dir))  # checks an s3:// URL's shape
    except DstackPlanError as e:
        raise DstackPlanError(f"--importer {given}: {e}") from None
    if not where.startswith(S3_SCHEME):
        where = str(Path(where).resolve())
    return Importer(project=name, state=where)


def _check_names(state: State, kind: str, names: Sequence[str]) -> None:
    missing = [n for n in names if state.get(f"{kind}.{n}") is None]
    if missing:
        known = sorted(r.name for r in state.resources.values() if r.kind == kind)
        raise DstackPlanError(
            f"no {kind} {', '.join(repr(n) for n in missing)} in this project's state "
            f"(its {kind}s: {', '.join(known) or 'none'}): apply it before exporting it"
        )


def created(
    state: State,
    name: str,
    fleets: Sequence[str],
    gateways: Sequence[str],
    importers: Sequence[Importer],
) -> State:
    """`state` with a new export; refused when the name is taken, when it shares nothing,
    or names a fleet or gateway the state does not hold."""
    if name in state.exports:
        raise DstackPlanError(f"export {name!r} exists: change it with `dstack export update`")
    if not fleets and not gateways:
        raise DstackPlanError(f"export {name!r}: name a --fleet or a --gateway to share")
    if not importers:
        raise DstackPlanError(f"export {name!r}: name an --importer project to share with")
    _check_names(state, "fleet", fleets)
    _check_names(state, "gateway", gateways)
    export = Export(
        name=name,
        fleets=tuple(dict.fromkeys(fleets)),
        gateways=tuple(dict.fromkeys(gateways)),
        importers=tuple({i.project: i for i in importers}.values()),
    )
    return state.model_copy(update={"exports": {**state.exports, name: export}})


def updated(
    state: State,
    name: str,
    *,
    add_fleets: Sequence[str] = (),
    remove_fleets: Sequence[str] = (),
    add_gateways: Sequence[str] = (),
    remove_gateways: Sequence[str] = (),
    add_importers: Sequence[Importer] = (),
    remove_importers: Sequence[str] = (),
) -> State:
    """`state` with export `name` changed. Removing an importer (or a fleet) refuses its new
    placements; what already runs keeps running."""
    export = _existing(state, name)
    _check_names(state, "fleet", add_fleets)
    _check_names(state, "gateway", add_gateways)
    fleets = [f for f in (*export.fleets, *add_fleets) if f not in remove_fleets]
    gateways = [g for g in (*export.gateways, *add_gateways) if g not in remove_gateways]
    importers = {i.project: i for i in (*export.importers, *add_importers)}
    for project in remove_importers:
        importers.pop(project, None)
    new = Export(
        name=name,
        fleets=tuple(dict.fromkeys(fleets)),
        gateways=tuple(dict.fromkeys(gateways)),
        importers=tuple(importers.values()),
    )
    return state.model_copy(update={"exports": {**state.exports, name: new}})


def deleted(state: State, name: str) -> State:
    """`state` without export `name`: its importers' new placements are refused."""
    _existing(state, name)
    return state.model_copy(
        update={"exports": {n: e for n, e in state.exports.items() if n != name}}
    )


def _existing(state: State, name: str) -> Export:
    export = state.exports.get(name)
    if export is None:
        raise DstackPlanError(
            f"no export {name!r} (exports: {', '.join(sorted(state.exports)) or 'none'})"
        )
    return export


async def edit(
    backend: StateBackend,
    change: Callable[[State], State],
    operation: str,
    *,
    lock_timeout: float = 0.0,
    clock: Clock | None = None,
) -> State:
    """Apply `change` to the stored state under the operation lock, as one commit; the
    state as written. The change is checked against the state read under the lock first,
    so a refusal leaves the state untouched."""
    async with hold_lock(backend, operation, timeout=lock_timeout, clock=clock):
        current = (await asyncio.to_thread(backend.read)).state
        change(current)  # raises before anything is written
        return (await commit_async(backend, change)).state
