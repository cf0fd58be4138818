"""Cron schedules (runs/schedule.py): UTC, dstack's weekday numbering, day boundaries."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from dstack_plan.config.runs import TaskSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.schedule import ScheduleError, check_cron, cron_due, next_run_at


def at(text: str) -> float:
    """Epoch seconds of a UTC time written `2026-12-01 09:00`."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc).timestamp()


def show(epoch: float | None) -> str:
    assert epoch is not None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%a %Y-%m-%d %H:%M")


def task(cron: Any) -> TaskSpec:
    return TaskSpec.model_validate(
        {"type": "task", "name": "nightly", "commands": ["x"], "schedule": {"cron": cron}}
    )


# 2026-12-01 is a Tuesday.
@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        ("0 9 * * *", "2026-12-01 08:00", "Tue 2026-12-01 09:00"),
        ("0 9 * * *", "2026-12-01 09:00", "Wed 2026-12-02 09:00"),  # strictly after
        ("30 23 * * *", "2026-12-01 23:45", "Wed 2026-12-02 23:30"),  # over a day boundary
        ("0 0 * * *", "2026-12-31 23:59", "Fri 2027-01-01 00:00"),  # and a year's
        ("*/15 * * * *", "2026-12-01 23:50", "Wed 2026-12-02 00:00"),
        (["0 18 * * *", "0 6 * * *"], "2026-12-01 12:00", "Tue 2026-12-01 18:00"),  # earliest
        (["0 18 * * *", "0 6 * * *"], "2026-12-01 19:00", "Wed 2026-12-02 06:00"),
        # weekdays count from Monday, as in dstack
        ("0 9 * * 0", "2026-12-01 10:00", "Mon 2026-12-07 09:00"),
        ("0 9 * * 6", "2026-12-01 10:00", "Sun 2026-12-06 09:00"),
        ("0 9 * * sun", "2026-12-01 10:00", "Sun 2026-12-06 09:00"),
        ("0 9 * * 0-4", "2026-12-04 10:00", "Mon 2026-12-07 09:00"),  # Mon-Fri, from a Friday
        ("0 9 * * 5,6", "2026-12-01 10:00", "Sat 2026-12-05 09:00"),
        ("0 9 * * */2", "2026-12-04 10:00", "Sun 2026-12-06 09:00"),  # Mon, Wed, Fri, Sun
        ("0 9 * * 4/2", "2026-12-01 10:00", "Fri 2026-12-04 09:00"),  # Fri, Sun
        ("0 9 * * 0 ", "2026-12-01 10:00", "Mon 2026-12-07 09:00"),
        # a restricted day of month AND weekday: both must match (the 1st that is a Monday)
        ("0 9 1 * 0", "2026-12-01 10:00", "Mon 2027-02-01 09:00"),
        ("0 9 1 jan *", "2026-12-01 10:00", "Fri 2027-01-01 09:00"),
    ],
)
def test_next_run_at(cron: Any, after: str, expected: str) -> None:
    assert show(next_run_at(task(cron), at(after))) == expected


@pytest.mark.parametrize("day", ["2026-03-29", "2026-03-08", "2026-10-25", "2026-11-01"])
def test_utc_has_no_dst(day: str) -> None:
    # days when Europe or the US shift their clocks: a UTC schedule does not move
    spec = task("0 1 * * *")
    first = next_run_at(spec, at(f"{day} 00:00"))
    assert first == at(f"{day} 01:00")
    assert next_run_at(spec, first) == first + 86400


@pytest.mark.parametrize(
    ("last_run", "now", "due"),
    [
        ("2026-12-01 08:00", "2026-12-01 08:59", False),
        ("2026-12-01 08:00", "2026-12-01 09:00", True),
        ("2026-12-01 09:00", "2026-12-01 09:01", False),  # it ran at 09:00: next is tomorrow
        ("2026-11-20 08:00", "2026-12-01 08:00", True),  # many missed: due (once)
    ],
)
def test_cron_due(last_run: str, now: str, due: bool) -> None:
    assert cron_due(task("0 9 * * *"), at(last_run), at(now)) is due


def test_no_schedule() -> None:
    spec = TaskSpec.model_validate({"type": "task", "name": "once", "commands": ["x"]})
    assert next_run_at(spec, at("2026-12-01 00:00")) is None
    assert cron_due(spec, 0.0, at("2026-12-01 00:00")) is False


@pytest.mark.parametrize(
    "expr", ["61 * * * *", "0 25 * * *", "0 9 * * 7", "0 9 * * funday", "0 9 * *", "* * * * * *"]
)
def test_invalid_expressions(expr: str) -> None:
    with pytest.raises(ScheduleError) as error:
        check_cron(expr)
    assert isinstance(error.value, DstackPlanError)
    assert repr(expr) in str(error.value)


def test_valid_expression() -> None:
    check_cron("0 9 * * mon-fri")
