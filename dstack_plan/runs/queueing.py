"""Runs apply records without starting them: queued and scheduled runs, and their attributes.

- Queued: no host of the run's fleet has room now (what runs there holds the GPUs or ports it
  needs, or no host answers) and its `retry` covers `no-capacity`: the run is recorded
  `pending`, without jobs, with `queued: {since, why, attempted_at}`; watch places it later
  (`watch/pending.py`). Without such a retry, apply fails as it always did.
- Scheduled: a task with `schedule.cron` is recorded `pending`, without jobs, with
  `schedule: {next_run_at, last_run_at}`; watch starts it when its cron fires.

Times are epoch seconds. `ps` reads these attribute names: keep them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.config.runs import RunSpec, TaskSpec
from dstack_plan.errors import ProviderError
from dstack_plan.plan.model import Placement

QUEUED_KEY = "queued"
SCHEDULE_KEY = "schedule"
NO_CAPACITY_EVENT = "no-capacity"
STOPPED_BY_USER = "stopped_by_user"
"""The run's `termination_reason` after `dstack stop` (dstack's name): neither a retry nor a
schedule starts it again."""


class NoCapacity(ProviderError):
    """The run would fit the fleet's hosts, but not now: what runs there holds what it needs
    (or no host of the fleet answers)."""


def waits_for_capacity(spec: RunSpec) -> bool:
    """Whether the run waits in the queue rather than fail when no host has room now."""
    return spec.retry is not None and NO_CAPACITY_EVENT in spec.retry.on_events


def scheduled(spec: RunSpec) -> bool:
    """Whether apply only records the run, for watch to start when its cron fires."""
    return isinstance(spec, TaskSpec) and spec.schedule is not None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Queued(_Record):
    """`attributes.queued` of a run waiting for capacity."""

    since: float
    """When it was queued: the start of its retry duration."""
    why: str
    """What it waits for (the placement's note)."""
    attempted_at: float | None = None
    """When watch last tried to place it (None: only apply did, at `since`)."""

    @property
    def last_attempt(self) -> float:
        return self.since if self.attempted_at is None else self.attempted_at

    @classmethod
    def of(cls, attributes: dict[str, Any]) -> Queued | None:
        """The run's queue record, or None when it is not queued (or the record is mangled)."""
        raw = attributes.get(QUEUED_KEY)
        try:
            return cls.model_validate(raw) if isinstance(raw, dict) else None
        except ValidationError:
            return None


class Scheduled(_Record):
    """`attributes.schedule` of a run with `schedule.cron`."""

    next_run_at: float | None
    """When its cron fires next (UTC epoch seconds)."""
    last_run_at: float | None = None
    """When it was last started by watch (None: never)."""

    @classmethod
    def of(cls, attributes: dict[str, Any]) -> Scheduled | None:
        raw = attributes.get(SCHEDULE_KEY)
        try:
            return cls.model_validate(raw) if isinstance(raw, dict) else None
        except ValidationError:
            return None


def next_fire(spec: RunSpec, after: float) -> float | None:
    """The first fire time of the run's schedule strictly after `after`."""
    from dstack_plan.runs.schedule import next_run_at  # croniter: only scheduled runs pay

    return next_run_at(spec, after)


def pending_attributes(fleet: str, extra: dict[str, Any]) -> dict[str, Any]:
    """A run entry's attributes with no jobs (nothing submitted), plus `extra`."""
    from dstack_plan.runs.records import RunRecord

    return {**RunRecord(fleet=fleet).to_json(), **extra}


_QUEUED_NOTE = "; queued: "
ESTIMATE_NOTE = "estimated start: "
"""How the plan's note of a pending run gives its estimated start (`runs/plan_wait.py`)."""


def waiting_for(placement: Placement) -> str:
    """What a pending placement waits for (its note, without what `plan_note` added)."""
    note = (placement.note or "pending").split(_QUEUED_NOTE, 1)[0]
    return note.split(f"; {ESTIMATE_NOTE}", 1)[0]


def plan_note(spec: object, placement: Placement, now: float) -> Placement:
    """The plan's placement of a run, its note saying what apply will do with a scheduled
    run (record it; watch starts it at its next fire time) or one that must wait for room
    (record it queued, when its retry covers no-capacity)."""
    from dstack_plan.apply.events import format_duration

    if not isinstance(spec, RunSpec):
        return placement
    if scheduled(spec):
        at = next_fire(spec, now)
        when = "never" if at is None else datetime.fromtimestamp(at, tz=timezone.utc)
        shown = when if isinstance(when, str) else when.strftime("%Y-%m-%d %H:%M UTC")
        note = f"scheduled: dstack watch starts it when its cron fires, next at {shown}"
        return placement.model_copy(update={"note": note})
    if placement.pending and not placement.placed and waits_for_capacity(spec):
        assert spec.retry is not None
        wait = format_duration(spec.retry.duration)
        found = (placement.note or "").split(_QUEUED_NOTE, 1)[0].split(f"; {ESTIMATE_NOTE}", 1)
        estimate = f"; {ESTIMATE_NOTE}{found[1]}" if len(found) == 2 else ""
        note = (
            f"{waiting_for(placement)}{estimate}{_QUEUED_NOTE}dstack watch places it when room "
            f"frees (retry on no-capacity for {wait})"
        )
        return placement.model_copy(update={"note": note})
    return placement
