"""The event log: append and read, the bound and trimming, filters, follow, no secrets."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.events import (
    DEFAULT_MAX_EVENTS,
    EVENTS_RECORD,
    MAX_REASON_LENGTH,
    Event,
    EventCursor,
    EventLog,
    span_id,
)
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.records import complete_lines
from dstack_plan.state.secrets import SecretGuard
from tests.unit.watch_records_backend import DictRecordsBackend

T0 = 1_700_000_000.0


def event(
    i: int, *, time: float | None = None, address: str = "task.train", **kw: object
) -> Event:
    fields: dict[str, object] = {
        "time": T0 + i if time is None else time,
        "address": address,
        "kind": "job",
        "span_id": span_id(address, 1),
        "old_status": "pending",
        "new_status": "running",
        "job_id": f"train-0-0-{i}",
    }
    fields.update(kw)
    return Event.model_validate(fields)


@pytest.fixture(params=["local", "cas-only"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StateBackend:
    if request.param == "local":
        return LocalBackend(tmp_path / ".dstack" / "state.json")
    return DictRecordsBackend()


def stored_lines(backend: StateBackend) -> int:
    return len(complete_lines(backend.read_record(EVENTS_RECORD).data))


def test_appended_events_read_back_in_order(backend: StateBackend) -> None:
    log = EventLog(backend)
    assert log.read() == []
    log.append([event(0), event(1, reason="exit code 1")])
    log.append([])
    log.append([event(2, old_status=None, kind="run", job_id=None)])
    assert log.read() == [
        event(0),
        event(1, reason="exit code 1"),
        event(2, old_status=None, kind="run", job_id=None),
    ]


def test_the_local_log_is_a_private_jsonl_file_beside_the_state(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    EventLog(backend).append([event(0), event(1)])
    path = tmp_path / ".dstack" / "events.jsonl"
    lines = path.read_bytes().splitlines()
    assert [Event.model_validate_json(line) for line in lines] == [event(0), event(1)]
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_log_keeps_the_last_events_and_trims_past_twice_the_bound(
    backend: StateBackend,
) -> None:
    log = EventLog(backend, max_events=10)
    for i in range(20):
        log.append([event(i)])
    assert stored_lines(backend) == 20  # not trimmed yet: rewrites stay rare
    assert log.read() == [event(i) for i in range(10, 20)]  # but only the bound is shown
    log.append([event(20)])
    assert stored_lines(backend) == 10
    assert log.read() == [event(i) for i in range(11, 21)]


def test_the_default_bound_is_ten_thousand(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    log = EventLog(backend)
    assert log.max_events == DEFAULT_MAX_EVENTS == 10_000
    log.append([event(i) for i in range(20_001)])
    assert stored_lines(backend) == 10_000
    kept = log.read()
    assert kept[0] == event(10_001) and kept[-1] == event(20_000)


def test_since_and_address_filter(backend: StateBackend) -> None:
    log = EventLog(backend)
    log.append(
        [
            event(0),
            event(1, address="service.llm"),
            event(2),
            event(3, address="fleet.gpu", kind="fleet"),
        ]
    )
    assert log.read(since=T0 + 1) == [
        event(1, address="service.llm"),
        event(2),
        event(3, address="fleet.gpu", kind="fleet"),
    ]
    assert log.read(address="task.train") == [event(0), event(2)]
    assert log.read(since=T0 + 1, address="task.train") == [event(2)]
    assert log.read(since=T0 + 4) == []


def test_torn_and_unreadable_lines_are_skipped_and_appends_go_on(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    log = EventLog(backend)
    log.append([event(0)])
    path = backend.record_path(EVENTS_RECORD)
    with path.open("ab") as f:
        f.write(b"not json\n" + event(1).model_dump_json().encode()[:30])  # a writer died
    assert log.read() == [event(0)]
    log.append([event(2)])
    assert log.read() == [event(0), event(2)]


def test_secret_values_never_reach_the_log(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    log = EventLog(backend, secret_guard=SecretGuard(["hunter2-password", "abc"]))
    log.append(
        [
            event(0, reason="failed: could not log in with hunter2-password"),
            event(1, reason="abc"),
            event(2, reason="abc is short, so only matched whole"),
        ]
    )
    raw = backend.record_path(EVENTS_RECORD).read_text()
    assert "hunter2" not in raw
    assert [e.reason for e in log.read()] == [
        "failed: could not log in with (sensitive)",
        "(sensitive)",
        "abc is short, so only matched whole",
    ]


def test_long_reasons_are_cut(backend: StateBackend) -> None:
    log = EventLog(backend)
    log.append([event(0, reason="x" * 10_000)])
    (stored,) = log.read()
    assert stored.reason is not None and len(stored.reason) == MAX_REASON_LENGTH
    assert stored.reason.endswith("...")


def test_span_ids_name_one_run_object() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert span_id("task.train", created) == "task.train@2026-01-02T03:04:05+00:00"
    assert span_id("task.train", 3) != span_id("task.train", 4)


def test_events_written_by_a_newer_version_still_read() -> None:
    line = event(0).model_dump_json()[:-1] + ', "severity": "info"}'
    assert Event.model_validate_json(line) == event(0)


def test_the_cursor_takes_each_event_once_even_at_equal_times() -> None:
    cursor = EventCursor(since=T0 + 1)
    same = [event(i, time=T0 + 1) for i in range(3)]
    assert cursor.take([event(0), *same[:2]]) == same[:2]  # since is inclusive
    assert cursor.take([event(0), *same[:2]]) == []
    assert cursor.take([event(0), *same, event(9)]) == [same[2], event(9)]
    assert cursor.take([event(0), *same, event(9)]) == []


def test_follow_yields_what_is_there_then_each_new_event(backend: StateBackend) -> None:
    log = EventLog(backend)
    log.append([event(0), event(1)])
    clock = FakeClock(T0)

    async def scenario() -> list[Event]:
        got: list[Event] = []
        stream = log.follow(since=T0 + 1, clock=clock, poll=0.5)
        got.append(await anext(stream))  # event(0) is before since
        log.append([event(2), event(2, job_id="other")])
        got.append(await anext(stream))
        got.append(await anext(stream))
        waiting = asyncio.ensure_future(anext(stream))
        for _ in range(20):  # many polls with nothing new: nothing is yielded twice
            await asyncio.sleep(0.01)
        assert not waiting.done()
        log.append([event(3)])
        got.append(await asyncio.wait_for(waiting, 10))
        await stream.aclose()
        return got

    assert asyncio.run(scenario()) == [event(1), event(2), event(2, job_id="other"), event(3)]
    assert clock.now() > T0  # it waited on the clock it was given between polls


def test_follow_batches_start_with_what_is_there_even_when_empty(backend: StateBackend) -> None:
    log = EventLog(backend)

    async def first() -> list[Event]:
        stream = log.follow_batches(since=None, clock=FakeClock(T0))
        batch = await anext(stream)
        await stream.aclose()
        return batch

    assert asyncio.run(first()) == []


def test_two_writers_at_once_lose_nothing(backend: StateBackend) -> None:
    log_a, log_b = EventLog(backend), EventLog(backend)
    if isinstance(backend, LocalBackend):  # a second backend object: its own open files
        log_b = EventLog(LocalBackend(backend.path))
    start = threading.Barrier(2)

    def write(log: EventLog, address: str) -> None:
        start.wait()
        for i in range(200):
            log.append([event(i, address=address), event(i, address=address, job_id="x")])

    threads = [
        threading.Thread(target=write, args=(log_a, "task.a")),
        threading.Thread(target=write, args=(log_b, "task.b")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = log_a.read()
    assert len(events) == 800
    for address in ("task.a", "task.b"):
        mine = [e for e in events if e.address == address]
        assert mine == [
            e
            for i in range(200)
            for e in (event(i, address=address), event(i, address=address, job_id="x"))
        ]
