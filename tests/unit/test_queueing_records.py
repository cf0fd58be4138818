"""The plan's note and the state attributes of queued and scheduled runs (`runs/queueing.py`)."""

from __future__ import annotations

from typing import Any

from dstack_plan.config.runs import TaskSpec
from dstack_plan.plan.model import Placement
from dstack_plan.runs.queueing import Queued, Scheduled, plan_note, scheduled, waits_for_capacity

WAITING = Placement(fleet="local", provider="local", placed=False, pending=True, note="pending: x")


def task(**fields: Any) -> TaskSpec:
    return TaskSpec.model_validate({"type": "task", "name": "train", "commands": ["ls"], **fields})


def test_only_a_retry_covering_no_capacity_queues_a_run() -> None:
    assert waits_for_capacity(task(retry=True))
    assert waits_for_capacity(task(retry={"on_events": ["no-capacity"], "duration": "2h"}))
    assert not waits_for_capacity(task(retry={"on_events": ["error"]}))
    assert not waits_for_capacity(task())


def test_the_plan_says_a_run_will_wait_for_capacity_with_its_retry_duration() -> None:
    note = plan_note(task(retry={"duration": "2h"}), WAITING, 0.0).note
    assert note == (
        "pending: x; queued: dstack watch places it when room frees "
        "(retry on no-capacity for 2h0m0s)"
    )
    assert plan_note(task(), WAITING, 0.0) == WAITING  # apply fails, as the note said
    placed = Placement(fleet="local", provider="local", placed=True)
    assert plan_note(task(retry=True), placed, 0.0) == placed


def test_the_plan_says_when_a_scheduled_task_runs_next() -> None:
    spec = task(schedule={"cron": "30 6 * * *"})
    assert scheduled(spec) and not scheduled(task())
    note = plan_note(spec, WAITING, 1_764_590_400.0).note  # 2025-12-01 12:00 UTC
    assert (
        note
        == "scheduled: dstack watch starts it when its cron fires, next at 2025-12-02 06:30 UTC"
    )


def test_records_read_back_and_mangled_ones_read_as_none() -> None:
    queued = Queued(since=10.0, why="waits for port 80")
    assert Queued.of({"queued": queued.to_json()}) == queued
    assert queued.last_attempt == 10.0
    assert Queued(since=10.0, why="", attempted_at=25.0).last_attempt == 25.0
    assert Queued.of({"queued": {"since": "soon"}}) is None and Queued.of({}) is None
    record = Scheduled(next_run_at=60.0)
    assert record.to_json() == {"next_run_at": 60.0, "last_run_at": None}
    assert Scheduled.of({"schedule": record.to_json()}) == record
    assert Scheduled.of({"schedule": "0 * * * *"}) is None
