"""Reading the state by hand: `dstack state list | show | pull | history`.

The writing commands (`rm`, `mv`, `push`) are in `state_edit.py`, `migrate` in
`state_migrate.py`.
"""

from __future__ import annotations

from typing import Any

from dstack_plan.inspect.state_edit import forget, unknown_address
from dstack_plan.state.backend import StateBackend

__all__ = ["forget", "history", "list_resources", "pull", "show_resource"]


def list_resources(backend: StateBackend) -> list[dict[str, Any]]:
    """Every resource in state, by address: {address, kind, name, provider, status, tainted}."""
    resources = backend.read().state.resources
    return [
        {
            "address": address,
            "kind": resources[address].kind,
            "name": resources[address].name,
            "provider": resources[address].provider,
            "status": resources[address].status,
            "tainted": resources[address].tainted,
        }
        for address in sorted(resources)
    ]


def show_resource(
    backend: StateBackend, address: str, *, version: str | None = None
) -> dict[str, Any]:
    """The state entry at `address` as JSON data (state never holds secret values), from the
    current state or from the stored `version` (an id from `history`)."""
    state = backend.read().state if version is None else backend.read_version(version)
    resource = state.get(address)
    if resource is None:
        where = backend.location if version is None else f"{backend.location} version {version}"
        raise unknown_address(address, state, where)
    return {"address": address, **resource.model_dump(mode="json")}


def pull(backend: StateBackend) -> str | None:
    """The state document as stored, or None when there is no state yet."""
    snapshot = backend.read()
    return snapshot.state.to_json() if snapshot.exists else None


def history(backend: StateBackend) -> list[dict[str, Any]]:
    """The stored versions, newest first: {id, serial, lineage, written_at, current}
    (written_at RFC 3339 in UTC, or null when the backend does not know)."""
    return [
        {
            "id": v.id,
            "serial": v.serial,
            "lineage": v.lineage,
            "written_at": (
                v.written_at.strftime("%Y-%m-%dT%H:%M:%SZ") if v.written_at is not None else None
            ),
            "current": v.current,
        }
        for v in backend.history()
    ]
