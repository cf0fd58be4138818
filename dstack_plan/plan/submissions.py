"""Submissions, dstack's way: `dstack apply -f FILE...` and the SDK create or update what they
are given and touch nothing else.

A submitted run may name a fleet, volume or gateway that is not among the files but is in
the project's state (applied earlier from another file), as dstack's runs name fleets created
before them. The planner then sees those state entries as the submission's *context*: they
resolve references and placement like declared resources, and are never changed by it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.resource import STATE_SOURCE, Desired, Resource, Source
from dstack_plan.config.units import parse_offable_duration
from dstack_plan.errors import PlanError
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.plan.planner import DesiredItem
from dstack_plan.state.model import ResourceState, State

DEFAULT_RETENTION = 24 * 3600
"""Seconds a finished submitted run stays in state (in `ps -a` and `logs`) before a plan of
the project removes it."""
SUBMITTED_RETENTION_ENV = "DSTACK_PLAN_SUBMITTED_RETENTION"
"""How long a finished submitted run stays in state (`submitted_retention`)."""


@dataclass(frozen=True)
class SubmissionContext:
    """What a submission plans against: the resources given, with the state entries their
    references may need beside them."""

    desired: Desired
    context: dict[str, ResourceState]
    """address -> the state entry each context resource was rebuilt from."""


def with_state_context(given: Desired, state: State) -> SubmissionContext:
    """`given` plus, from `state`, every fleet, volume and gateway it does not hold, and the
    runs its resources name in `depends_on`: what the given runs may refer to.

    Entries whose spec this version cannot read again are left out (a reference to one is
    then reported as to anything undeclared)."""
    wanted = {a for r in given for a in r.spec.depends_on}
    resources = dict(given.resources)
    context: dict[str, ResourceState] = {}
    for address, entry in state.resources.items():
        if address in resources or (entry.kind in RUN_KINDS and address not in wanted):
            continue
        try:
            spec = spec_from_normalized(entry.kind, dict(entry.spec))
        except ValueError:
            continue
        resources[address] = Resource(entry.kind, entry.name, spec, Source(STATE_SOURCE, 0))
        context[address] = entry
    return SubmissionContext(replace(given, resources=resources, submission=True), context)


def context_item(entry: ResourceState) -> DesiredItem:
    """A submission's context entry as the planner sees a declared resource: unchanged."""
    return DesiredItem(
        address=entry.address,
        kind=entry.kind,
        name=entry.name,
        provider=entry.provider,
        spec=dict(entry.spec),
        depends_on=entry.depends_on,
    )


def submitted_retention() -> int | None:
    """Seconds a finished submitted run stays in state: `$DSTACK_PLAN_SUBMITTED_RETENTION`
    (a duration such as `24h` or `3d`, or `off` to keep them until deleted), else a day."""
    raw = os.environ.get(SUBMITTED_RETENTION_ENV)
    if not raw:
        return DEFAULT_RETENTION
    try:
        value = parse_offable_duration(raw)
    except ValueError as e:
        raise PlanError(f"{SUBMITTED_RETENTION_ENV}: {e}") from None
    if value == "off":
        return None
    return DEFAULT_RETENTION if value is None else value


def finished_at(entry: ResourceState, jobs_finished: Iterable[float | None]) -> float | None:
    """When a finished run ended (epoch seconds): its last job's end, else when its entry
    last changed; None while it has not finished."""
    if entry.kind not in RUN_KINDS or entry.status not in FINISHED_STATUSES:
        return None
    ends = [t for t in jobs_finished if t is not None]
    return max(ends) if ends else entry.updated_at.timestamp()


def expired(
    ended: Mapping[str, float], state: State, now: float, retention: int | None
) -> dict[str, str]:
    """address -> why each submitted run that finished more than `retention` seconds before
    `now` leaves state (`ended`: when each finished run ended); none when retention is off."""
    if retention is None:
        return {}
    result = {}
    for address, end in ended.items():
        entry = state.get(address)
        if entry is None or not entry.submitted or now - end < retention:
            continue
        hours = (now - end) / 3600
        result[address] = (
            f"submitted, finished {hours:.0f}h ago: kept for {_hours(retention)} "
            "(DSTACK_PLAN_SUBMITTED_RETENTION)"
        )
    return result


def _hours(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds}s"
