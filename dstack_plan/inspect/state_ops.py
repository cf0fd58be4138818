"""Reading and editing the state by hand: `dstack state list | show | rm | pull | unlock`."""

from __future__ import annotations

from typing import Any

from dstack_plan.clock import Clock
from dstack_plan.errors import StateError
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.commit import commit_async
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.model import State


def _unknown(address: str, state: State, location: str) -> StateError:
    known = ", ".join(state.addresses) or "none"
    return StateError(f"no resource {address!r} in the state at {location} (known: {known})")


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


def show_resource(backend: StateBackend, address: str) -> dict[str, Any]:
    """The state entry at `address` as JSON data (state never holds secret values)."""
    state = backend.read().state
    resource = state.get(address)
    if resource is None:
        raise _unknown(address, state, backend.location)
    return {"address": address, **resource.model_dump(mode="json")}


def pull(backend: StateBackend) -> str | None:
    """The state document as stored, or None when there is no state yet."""
    snapshot = backend.read()
    return snapshot.state.to_json() if snapshot.exists else None


async def forget(
    backend: StateBackend,
    addresses: list[str],
    *,
    lock_timeout: float = 0.0,
    clock: Clock | None = None,
) -> list[str]:
    """Remove `addresses` from state without destroying what they describe.

    Holds the operation lock (an apply must not be writing the same entries) and commits
    once. All addresses must exist, or nothing is removed. Returns the removed addresses.
    """
    wanted = list(dict.fromkeys(addresses))
    async with hold_lock(backend, "state rm", timeout=lock_timeout, clock=clock):
        state = backend.read().state
        for address in wanted:
            if state.get(address) is None:
                raise _unknown(address, state, backend.location)

        def remove(latest: State) -> State:
            for address in wanted:
                latest = latest.without(address)
            return latest

        await commit_async(backend, remove)
    return wanted
