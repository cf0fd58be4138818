"""The state entries the engine writes around each operation, as pure functions.

Crash safety rests on these: an intent entry (tainted, status `creating`) is committed before
any create, so a process killed mid-create leaves something the next plan replaces.

A create-before-destroy replace keeps the old object in the new entry's attributes under
`DEPOSED_KEY` until it is destroyed (Terraform's "deposed" objects): state holds one entry per
address, and nothing that exists may be forgotten. Handlers never see that key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dstack_plan.apply.handlers import Outcome
from dstack_plan.errors import PlanError
from dstack_plan.plan.model import CREATING, DEPOSED_KEY, ResourceChange
from dstack_plan.state.commit import Mutation
from dstack_plan.state.model import ResourceState, State

__all__ = ["CREATING"]  # the intent's status; defined beside the plan, which reads it too


def deposed_of(entry: ResourceState | None) -> list[ResourceState]:
    """The old objects recorded in `entry` that still have to be destroyed."""
    if entry is None:
        return []
    raw = entry.attributes.get(DEPOSED_KEY) or []
    if not isinstance(raw, list):
        return []
    return [ResourceState.model_validate(item) for item in raw]


def for_handler(entry: ResourceState) -> ResourceState:
    """`entry` as handlers see it: without the engine's deposed bookkeeping."""
    if DEPOSED_KEY not in entry.attributes:
        return entry
    attributes = {k: v for k, v in entry.attributes.items() if k != DEPOSED_KEY}
    return entry.model_copy(update={"attributes": attributes})


def _with_deposed(attributes: dict[str, Any], deposed: list[ResourceState]) -> dict[str, Any]:
    attributes = {k: v for k, v in attributes.items() if k != DEPOSED_KEY}
    if deposed:
        attributes[DEPOSED_KEY] = [d.model_dump(mode="json") for d in deposed]
    return attributes


def _desired_spec(change: ResourceChange) -> dict[str, Any]:
    if change.after is None:
        raise PlanError(f"{change.address}: the plan has no desired spec to {change.action.value}")
    return change.after


def intent(
    change: ResourceChange, now: datetime, deposed: list[ResourceState] | None = None
) -> ResourceState:
    """The tainted `creating` entry committed before a create starts."""
    return ResourceState.create(
        change.address,
        provider=change.provider,
        spec=_desired_spec(change),
        status=CREATING,
        now=now,
        attributes=_with_deposed({}, deposed or []),
        depends_on=change.depends_on,
        tainted=True,
        submitted=bool(change.submitted),
    )


def created(
    change: ResourceChange,
    outcome: Outcome,
    now: datetime,
    previous: ResourceState | None,
    deposed: list[ResourceState] | None = None,
) -> ResourceState:
    """The entry after a successful create; keeps `created_at` of the intent (`previous`)."""
    spec = _desired_spec(change)
    attributes = _with_deposed(dict(outcome.attributes), deposed or [])
    if previous is None:
        return ResourceState.create(
            change.address,
            provider=change.provider,
            spec=spec,
            status=outcome.status,
            now=now,
            attributes=attributes,
            depends_on=change.depends_on,
            tainted=False,
            submitted=bool(change.submitted),
        )
    return previous.updated(
        now=now,
        provider=change.provider,
        spec=spec,
        status=outcome.status,
        attributes=attributes,
        depends_on=change.depends_on,
        tainted=False,
        submitted=_origin(change, previous),
    )


def updated(
    change: ResourceChange, outcome: Outcome, now: datetime, current: ResourceState
) -> ResourceState:
    """The entry after a successful in-place update.

    The outcome's attributes replace the recorded ones (the handler was given `current` to
    carry over what still holds); deposed bookkeeping is kept.
    """
    return current.updated(
        now=now,
        provider=change.provider,
        spec=_desired_spec(change),
        status=outcome.status,
        attributes=_with_deposed(dict(outcome.attributes), deposed_of(current)),
        depends_on=change.depends_on,
        tainted=False,
        submitted=_origin(change, current),
    )


def _origin(change: ResourceChange, entry: ResourceState) -> bool:
    """Whether the entry is recorded as submitted after `change`: as the plan says, else as
    it was (watch's in-place changes, plans saved before submissions existed)."""
    return entry.submitted if change.submitted is None else change.submitted


def put_origin(change: ResourceChange, now: datetime) -> Mutation:
    """Record the entry of an unchanged resource as submitted or declared, as planned."""

    def mutate(state: State) -> State:
        entry = state.get(change.address)
        if entry is None or change.submitted is None:
            return state
        return state.with_resource(entry.updated(now=now, submitted=change.submitted))

    return mutate


def put(entry: ResourceState) -> Mutation:
    """Store `entry` at its address."""
    return lambda state: state.with_resource(entry)


def put_created(
    change: ResourceChange, outcome: Outcome, now: datetime, deposed: list[ResourceState]
) -> Mutation:
    """Record a finished create over whatever the address holds (normally our intent)."""
    return lambda state: state.with_resource(
        created(change, outcome, now, state.get(change.address), deposed)
    )


def put_updated(change: ResourceChange, outcome: Outcome, now: datetime) -> Mutation:
    """Record a finished update on the latest version of the entry."""

    def mutate(state: State) -> State:
        current = state.get(change.address)
        if current is None:  # removed by hand meanwhile: record what the update produced
            return state.with_resource(created(change, outcome, now, None))
        return state.with_resource(updated(change, outcome, now, current))

    return mutate


def remove(address: str) -> Mutation:
    """Forget `address` after its object was destroyed."""
    return lambda state: state.without(address)


def drop_deposed(address: str, gone: ResourceState, now: datetime) -> Mutation:
    """Forget one deposed object of `address` after it was destroyed."""

    def mutate(state: State) -> State:
        entry = state.get(address)
        if entry is None:
            return state
        left = [d for d in deposed_of(entry) if d != gone]
        attributes = _with_deposed(dict(entry.attributes), left)
        return state.with_resource(entry.updated(now=now, attributes=attributes))

    return mutate
