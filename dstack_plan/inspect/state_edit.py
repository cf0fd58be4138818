"""Editing the state by hand: `dstack state rm | mv | push`, each under the operation lock.

Every write goes through the backend, so each keeps its backup (local: `state.json.backup`
and the history; S3: bucket versioning or `<key>.backup`) and is a compare-and-swap.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from dstack_plan.clock import Clock
from dstack_plan.errors import StateError
from dstack_plan.state.backend import StateBackend, StateSnapshot
from dstack_plan.state.commit import commit_async
from dstack_plan.state.importing import importing
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.model import ResourceState, State, parse_address


def unknown_address(address: str, state: State, location: str) -> StateError:
    """The error for an address the state does not hold, listing those it does."""
    known = ", ".join(state.addresses) or "none"
    return StateError(f"no resource {address!r} in the state at {location} (known: {known})")


def _with_depends_on(resource: ResourceState, depends_on: tuple[str, ...]) -> ResourceState:
    # no `updated`: re-addressing is bookkeeping, not a change of the resource
    return resource.model_copy(update={"depends_on": tuple(sorted(set(depends_on)))})


def without_addresses(state: State, addresses: list[str]) -> State:
    """`state` without `addresses`, and without them in anyone's `depends_on`."""
    gone = set(addresses)
    resources = {
        address: (
            _with_depends_on(r, tuple(d for d in r.depends_on if d not in gone))
            if gone.intersection(r.depends_on)
            else r
        )
        for address, r in state.resources.items()
        if address not in gone
    }
    return state.model_copy(update={"resources": resources})


async def forget(
    backend: StateBackend,
    addresses: list[str],
    *,
    lock_timeout: float = 0.0,
    clock: Clock | None = None,
) -> list[str]:
    """Remove `addresses` from state without destroying what they describe, and drop them
    from every other resource's `depends_on` (nothing left in state points at them).

    Holds the operation lock (an apply must not be writing the same entries) and commits
    once. All addresses must exist, or nothing is removed. Returns the removed addresses.
    """
    wanted = list(dict.fromkeys(addresses))
    async with hold_lock(backend, "state rm", timeout=lock_timeout, clock=clock):
        state = (await asyncio.to_thread(backend.read)).state
        for address in wanted:
            if state.get(address) is None:
                raise unknown_address(address, state, backend.location)
        await commit_async(backend, lambda latest: without_addresses(latest, wanted))
    return wanted


def _renamed_spec(
    spec: dict[str, Any], source: str, target: str, *, own: bool, fleet_rename: bool
) -> dict[str, Any]:
    """`spec` naming `target` where it named `source`: its own `name` (the moved resource),
    `depends_on`, and a run's `fleets` when a fleet moves. Stored specs are compared with the
    YAML, so a renamed resource whose YAML is renamed too plans as a no-op."""
    old_name, new_name = source.split(".", 1)[1], target.split(".", 1)[1]
    out = dict(spec)
    if own and out.get("name") == old_name:
        out["name"] = new_name
    depends = out.get("depends_on")
    if isinstance(depends, list) and source in depends:
        out["depends_on"] = [target if d == source else d for d in depends]
    fleets = out.get("fleets")
    if fleet_rename and isinstance(fleets, list) and old_name in fleets:
        out["fleets"] = [new_name if f == old_name else f for f in fleets]
    return out


def moved(state: State, source: str, target: str, location: str) -> State:
    """`state` with `source` re-addressed as `target` (same kind; `target` must be free),
    every `depends_on` naming `source` rewritten (in state and in stored specs), and for a
    fleet the runs' `fleets` and `fleet` attribute (the fleet they run on) too."""
    try:
        src_kind, src_name = parse_address(source)
        dst_kind, dst_name = parse_address(target)
    except ValueError as err:
        raise StateError(str(err)) from None
    if state.get(source) is None:
        raise unknown_address(source, state, location)
    if src_kind != dst_kind:
        raise StateError(
            f"cannot move {source} to {target}: a resource keeps its kind ({src_kind})"
        )
    if target in state.resources:
        raise StateError(f"cannot move {source} to {target}: {target} already exists in state")
    fleet_rename = src_kind == "fleet"
    resources: dict[str, ResourceState] = {}
    for address, entry in state.resources.items():
        own = address == source
        data = entry.model_dump()
        if own:
            address, data["name"] = target, dst_name
        if source in entry.depends_on:
            data["depends_on"] = [target if d == source else d for d in entry.depends_on]
        runs_on_it = entry.kind != "fleet" and entry.attributes.get("fleet") == src_name
        if fleet_rename and runs_on_it:
            data["attributes"] = {**entry.attributes, "fleet": dst_name}
        data["spec"] = _renamed_spec(
            entry.spec, source, target, own=own, fleet_rename=fleet_rename and not own
        )
        if data["spec"] != entry.spec:
            data["spec_hash"] = ""  # recomputed from the rewritten spec
        changed = data != entry.model_dump()
        # no `updated_at` change: re-addressing is bookkeeping, not a change of the resource
        resources[address] = ResourceState.model_validate(data) if changed else entry
    return state.model_copy(update={"resources": dict(sorted(resources.items()))})


async def move(
    backend: StateBackend,
    source: str,
    target: str,
    *,
    lock_timeout: float = 0.0,
    clock: Clock | None = None,
) -> StateSnapshot:
    """`dstack state mv SOURCE TARGET` under the operation lock; one commit."""
    async with hold_lock(backend, "state mv", timeout=lock_timeout, clock=clock):
        return await commit_async(
            backend, lambda latest: moved(latest, source, target, backend.location)
        )


class Pushed(NamedTuple):
    """What `state push` did: the stored snapshot now, and whether anything was written."""

    snapshot: StateSnapshot
    written: bool


def check_push(current: StateSnapshot, pushed: State, location: str) -> None:
    """Terraform's rules for `state push` without --force: StateError when `pushed` is of
    another lineage, older than what is stored, or as old but different."""
    if not current.exists:
        return
    stored = current.state
    hint = " (--force overrides)"
    if pushed.lineage != stored.lineage:
        raise StateError(
            f"cannot push state of lineage {pushed.lineage} over unrelated state of lineage"
            f" {stored.lineage} at {location}{hint}"
        )
    if pushed.serial < stored.serial:
        raise StateError(
            f"cannot push state with serial {pushed.serial} over newer state with serial"
            f" {stored.serial} at {location}{hint}"
        )
    if pushed.serial == stored.serial and not pushed.same_content(stored):
        raise StateError(
            f"cannot push state with serial {pushed.serial} over different state with the same"
            f" serial at {location}: pull, merge, and push with a higher serial{hint}"
        )


async def push(
    backend: StateBackend,
    pushed: State,
    *,
    force: bool = False,
    lock_timeout: float = 0.0,
    clock: Clock | None = None,
) -> Pushed:
    """Replace the stored state with `pushed` under the operation lock (one CAS write).

    Without `force`, `check_push`'s rules apply. The written state keeps `pushed`'s serial
    (or stored + 1 when that is higher: a serial never goes down in a backend).
    """
    async with hold_lock(backend, "state push", timeout=lock_timeout, clock=clock):

        def write() -> Pushed:
            current = backend.read()
            if not force:
                check_push(current, pushed, backend.location)
            with importing(other_lineage=force):
                after = backend.write(pushed, current.version)
            return Pushed(after, after.version != current.version)

        return await asyncio.to_thread(write)
