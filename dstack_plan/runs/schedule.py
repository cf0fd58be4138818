"""When a run with `schedule.cron` is due (pure: time comes in), with the croniter library.

dstack reads its cron expressions with APScheduler's `CronTrigger.from_crontab`, in UTC, and
so differs from POSIX cron in two ways that we keep, so that a schedule fires when it did under
dstack:
- weekday numbers count from Monday: `0` is Monday, `6` is Sunday (`7` is an error); names
  (`mon`..`sun`) mean what they say;
- when both the day of month and the weekday are restricted, a day must match both (POSIX
  fires on either).

A run is due when a fire time of any of its expressions has come since it last ran: fire times
missed while nothing watched (or while the previous run still ran) make one run, not many.
"""

from __future__ import annotations

from datetime import datetime, timezone

from croniter import croniter

from dstack_plan.config.cron import posix_cron
from dstack_plan.config.profile import Schedule
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import DstackPlanError


class ScheduleError(DstackPlanError):
    """A `schedule.cron` expression is not valid."""


def next_run_at(schedule: Schedule | RunSpec | None, after: float) -> float | None:
    """The first fire time strictly after `after` of any of the schedule's expressions (epoch
    seconds, UTC), or None without a schedule."""
    if isinstance(schedule, RunSpec):
        schedule = schedule.schedule
    if schedule is None:
        return None
    start = datetime.fromtimestamp(after, tz=timezone.utc)
    return min(_iter(expr, start).get_next(float) for expr in schedule.cron)


def cron_due(spec: RunSpec, last_run_at: float, now: float) -> bool:
    """Whether `spec`'s schedule has fired since `last_run_at` (when its previous run started,
    so that fire times while it ran make one run after it; when it was applied, if it never
    ran). False without a schedule."""
    due = next_run_at(spec, last_run_at)
    return due is not None and due <= now


def check_cron(expr: str) -> None:
    """Raise `ScheduleError` when `expr` is not a valid (dstack) cron expression."""
    _iter(expr, datetime.fromtimestamp(0, tz=timezone.utc))


def _iter(expr: str, start: datetime) -> croniter:
    posix = _posix(expr)
    try:
        return croniter(posix, start, day_or=False)
    except (ValueError, KeyError) as e:  # croniter's errors subclass ValueError
        raise ScheduleError(f"invalid cron expression {expr!r}: {e}") from None


def _posix(expr: str) -> str:
    """`expr` in croniter's weekday numbering (see `config/cron.py`)."""
    try:
        return posix_cron(expr)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
