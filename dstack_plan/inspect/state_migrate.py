"""`dstack state migrate --to WHERE`: copy the state to another backend, then use that one.

The copy keeps lineage and serial (a saved plan stays valid across it), is made under both
operation locks, and refuses a target that already holds another history or a newer state.
The source is left as it was (a backup to fall back on); `.dstack/backend.yml` then names the
target, so every later command uses it.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import NamedTuple

from dstack_plan.clock import Clock
from dstack_plan.errors import StateError
from dstack_plan.state.backend import StateBackend, StateSnapshot
from dstack_plan.state.backend_config import (
    BackendConfig,
    LocalBackendConfig,
    S3BackendConfig,
    save_backend_config,
)
from dstack_plan.state.importing import importing
from dstack_plan.state.local import DEFAULT_STATE_PATH
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.select import Where


class Migrated(NamedTuple):
    """The state now at the target, whether it had to be written, and the settings file."""

    snapshot: StateSnapshot
    written: bool
    config_file: Path


def check_target(source: StateSnapshot, target: StateSnapshot, where: str) -> None:
    """StateError when the target holds a state the copy must not replace."""
    if not target.exists:
        return
    held, moving = target.state, source.state
    if held.lineage != moving.lineage:
        raise StateError(
            f"{where} already holds a state of another lineage ({held.lineage}, serial"
            f" {held.serial}); refusing to replace it with lineage {moving.lineage}."
            " Pick an empty location, or remove that state first."
        )
    if held.serial > moving.serial:
        raise StateError(
            f"{where} holds a newer state of this lineage (serial {held.serial}, migrating"
            f" {moving.serial}): someone already works there; point this project at it with"
            " `dstack init --backend` instead"
        )
    if held.serial == moving.serial and not held.same_content(moving):
        raise StateError(
            f"{where} holds a different state with the same serial {held.serial}; refusing"
            " to replace it"
        )


def config_for(where: Where, project_dir: Path) -> BackendConfig:
    """The `.dstack/backend.yml` settings that name `where`."""
    if isinstance(where, Path):
        absolute = where.resolve()
        if absolute == (project_dir / DEFAULT_STATE_PATH).resolve():
            return LocalBackendConfig(backend="local")
        try:
            shown = str(absolute.relative_to(project_dir.resolve()))
        except ValueError:
            shown = str(absolute)
        return LocalBackendConfig(backend="local", path=shown)
    return S3BackendConfig(
        backend="s3",
        bucket=where.bucket,
        key=where.key,
        region=where.region,
        endpoint_url=where.endpoint_url,
        profile=where.profile,
        kms_key_id=where.kms_key_id,
    )


async def migrate(
    source: StateBackend,
    target: StateBackend,
    target_where: Where,
    project_dir: Path,
    *,
    lock_timeout: float = 0.0,
    clock: Clock | None = None,
) -> Migrated:
    """Copy `source`'s state to `target` (see the module docstring) and switch the project."""
    if source.location == target.location:
        raise StateError(f"the state is already at {target.location}")
    async with AsyncExitStack() as stack:
        for backend in (source, target):
            await stack.enter_async_context(
                hold_lock(backend, "state migrate", timeout=lock_timeout, clock=clock)
            )

        def copy() -> tuple[StateSnapshot, bool]:
            moving = source.read()
            if not moving.exists or moving.state.serial == 0:
                raise StateError(
                    f"no state at {source.location} to migrate; to use another backend for a"
                    " new project, run `dstack init --backend ...`"
                )
            there = target.read()
            check_target(moving, there, target.location)
            with importing():
                written = target.write(moving.state, there.version)
            stored = target.read()
            if (stored.state.lineage, stored.state.serial) != (
                moving.state.lineage,
                moving.state.serial,
            ) or not stored.state.same_content(moving.state):
                raise StateError(
                    f"{target.location}: the copy reads back different; not switching"
                )
            return written, written.version != there.version

        snapshot, written = await asyncio.to_thread(copy)
    config_file = save_backend_config(project_dir, config_for(target_where, project_dir))
    return Migrated(snapshot, written, config_file)
