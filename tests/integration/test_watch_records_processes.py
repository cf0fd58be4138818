"""watch's records across real processes: the leader lease race, two event-log writers."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.synchronize import Barrier
from pathlib import Path
from queue import Queue

import pytest

from dstack_plan.state.events import EventLog
from dstack_plan.state.lease import LeaderLease
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.records import complete_lines
from tests.unit.test_event_log import event

CTX = mp.get_context("fork")  # children start in milliseconds with everything imported
pytestmark = pytest.mark.timeout(120)
ROUNDS = 50


def _race(root: Path, holder: str, start: Barrier, results: Queue) -> None:
    for n in range(ROUNDS):
        lease = LeaderLease(LocalBackend(root / f"round-{n}" / "state.json"), holder, ttl=600)
        start.wait()  # both try at the same moment, on a lease nobody holds yet
        results.put((n, holder, lease.acquire_or_renew()))


def test_two_processes_racing_for_the_lease_never_both_lead(tmp_path: Path) -> None:
    start, results = CTX.Barrier(2), CTX.Queue()
    procs = [CTX.Process(target=_race, args=(tmp_path, h, start, results)) for h in "ab"]
    for p in procs:
        p.start()
    outcomes: dict[int, dict[str, bool]] = {}
    for _ in range(2 * ROUNDS):
        n, holder, led = results.get(timeout=60)
        outcomes.setdefault(n, {})[holder] = led
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for n in range(ROUNDS):
        assert sorted(outcomes[n].values()) == [False, True], (n, outcomes[n])
    winners = {next(h for h, led in outcomes[n].items() if led) for n in range(ROUNDS)}
    assert winners  # (usually both: the race is real)


def _append(path: Path, address: str, count: int, start: Barrier) -> None:
    log = EventLog(LocalBackend(path), max_events=50)
    start.wait()
    for i in range(count):
        log.append([event(i, address=address)])


def test_two_writer_processes_trim_without_losing_recent_events(tmp_path: Path) -> None:
    path = tmp_path / ".dstack" / "state.json"
    count, start = 300, CTX.Barrier(2)
    procs = [
        CTX.Process(target=_append, args=(path, address, count, start))
        for address in ("task.a", "task.b")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    backend = LocalBackend(path)
    lines = complete_lines(backend.read_record("events.jsonl").data)
    assert 50 <= len(lines) <= 100  # trimmed to the bound, never past twice the bound
    events = EventLog(backend, max_events=100).read()
    assert len(events) == len(lines)  # every stored line is a whole event
    for address in ("task.a", "task.b"):
        mine = [e.job_id for e in events if e.address == address]
        # trimming drops only the oldest: each writer's events are its newest, no gaps
        assert mine == [f"train-0-0-{i}" for i in range(count - len(mine), count)], address
