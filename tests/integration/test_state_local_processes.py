"""The local backend across real processes: concurrent commits, the lock, kill -9."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import signal
import time
from datetime import datetime, timezone
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from queue import Queue

import pytest

from dstack_plan.config.atomic import leftover_temp_files
from dstack_plan.errors import LockError
from dstack_plan.state import (
    LocalBackend,
    ResourceState,
    State,
    StateConflictError,
    commit,
    parse_state,
)
from tests.infra.recording_clock import RecordingClock

# fork: children start in milliseconds with everything imported, which keeps trials cheap.
CTX = mp.get_context("fork")
NOW = datetime(2025, 1, 2, tzinfo=timezone.utc)
pytestmark = pytest.mark.timeout(300)
NET = 60.0
"""Seconds a test waits for another process before concluding it will not get there (a
safety net: passing never waits it out)."""


def entry(address: str, **spec: object) -> ResourceState:
    return ResourceState.create(address, provider="local", spec=spec, status="ok", now=NOW)


def _commit_many(
    path: Path, worker: int, count: int, optimistic: bool, start: Barrier, calls: Queue
) -> None:
    backend = LocalBackend(path)
    mutations = 0

    def add(state: State, i: int) -> State:
        nonlocal mutations
        mutations += 1
        return state.with_resource(entry(f"task.w{worker}-{i}", worker=worker, i=i))

    start.wait()
    for i in range(count):
        if not optimistic:
            commit(backend, lambda state, i=i: add(state, i))
            continue
        while True:  # CAS alone, as with a backend without `exclusive` (S3)
            snapshot = backend.read()
            try:
                backend.write(add(snapshot.state, i), snapshot.version)
                break
            except StateConflictError:
                pass
    calls.put(mutations)


@pytest.mark.parametrize("optimistic", [False, True], ids=["commit", "cas-retry-loop"])
def test_concurrent_read_modify_write_loses_nothing(tmp_path: Path, optimistic: bool) -> None:
    path = tmp_path / ".dstack" / "state.json"
    workers, per_worker = 4, 20
    start, calls = CTX.Barrier(workers), CTX.Queue()
    procs = [
        CTX.Process(target=_commit_many, args=(path, w, per_worker, optimistic, start, calls))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(NET)
        assert p.exitcode == 0
    state = LocalBackend(path).read().state
    total = workers * per_worker
    assert state.serial == total
    expected = {f"task.w{w}-{i}" for w in range(workers) for i in range(per_worker)}
    assert set(state.resources) == expected
    mutations = sum(calls.get(timeout=NET) for _ in procs)
    if optimistic:
        assert mutations > total  # racing writers really did conflict and retry
    else:
        assert mutations == total  # commit serialises under the write lock: no conflicts


def _hold_lock(path: Path, who: str, ready: Event, release: Event) -> None:
    handle = asyncio.run(LocalBackend(path).lock("apply", who=who))
    ready.set()
    release.wait(600)  # a safety net: the test sets it
    handle.release()


def _start_holder(path: Path, who: str) -> tuple[mp.process.BaseProcess, Event, Event]:
    ready, release = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=_hold_lock, args=(path, who, ready, release))
    proc.start()
    assert ready.wait(NET), "lock holder did not start"
    return proc, ready, release


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    holder, _, release = _start_holder(backend.path, "alice@ci-runner")
    try:
        with pytest.raises(LockError) as info:
            asyncio.run(backend.lock("destroy", who="bob@laptop"))
        message, held = str(info.value), info.value.holder
        assert held is not None and held.pid == holder.pid
        assert backend.read_lock_info() == held
        for expected in (
            "Lock Info:",
            f"ID:        {held.id}",
            "Operation: apply",
            "Who:       alice@ci-runner",
            "Created:   ",
        ):
            assert expected in message

        # With a timeout, the second waits (backoff steps of 0.5 s, then doubling, on its
        # clock) until the first releases: here, while it waits its second step.
        def release_during_the_second_wait(seconds: float) -> None:
            if len(clock.sleeps) == 2:
                release.set()
                holder.join(NET)  # its flock goes with it

        clock = RecordingClock(on_sleep=release_during_the_second_wait)
        handle = asyncio.run(backend.lock("destroy", who="bob@laptop", timeout=3600, clock=clock))
        assert handle.info.who == "bob@laptop"
        assert clock.sleeps == [0.5, 1.0]  # it tried again after each step, and then got it
        handle.release()
    finally:
        release.set()
        holder.join(NET)
    assert holder.exitcode == 0


def test_lock_timeout_gives_up(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    holder, _, release = _start_holder(backend.path, "alice@ci-runner")
    try:
        clock = RecordingClock()
        with pytest.raises(LockError, match="Gave up after waiting 2.5s") as info:
            asyncio.run(backend.lock("destroy", timeout=2.5, clock=clock))
        # it waited its backoff steps, never past the deadline, then tried one last time
        assert clock.sleeps == [0.5, 1.0, 1.0]
        assert "alice@ci-runner" in str(info.value)
    finally:
        release.set()
        holder.join(NET)


def test_sigkilled_holder_frees_the_lock(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    holder, _, _ = _start_holder(backend.path, "doomed@ci")
    stale = backend.read_lock_info()
    assert stale is not None and stale.who == "doomed@ci"
    os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
    holder.join(NET)
    assert backend.lock_info_path.exists()  # its record stays behind, but binds nobody
    assert backend.read_lock_info() is None
    backend.unlock(stale.id)  # force-unlock just tidies the record away
    assert not backend.lock_info_path.exists()

    holder, _, _ = _start_holder(backend.path, "doomed-again@ci")
    os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
    holder.join(NET)
    handle = asyncio.run(backend.lock("apply", who="rescuer@ci"))
    assert backend.read_lock_info() == handle.info
    handle.release()


def _write_forever(path: Path, started: Event) -> None:
    backend = LocalBackend(path)
    padding = "x" * 20_000  # ~400 kB files, so a kill often lands mid-write

    def bump(state: State) -> State:
        counter = state.serial + 1  # carries on from the previous (killed) writer
        address = f"task.r{counter % 20}"
        return state.with_resource(entry(address, counter=counter, padding=padding))

    while True:
        commit(backend, bump)
        started.set()


def test_kill_minus_nine_mid_write_never_corrupts_state(tmp_path: Path) -> None:
    path = tmp_path / ".dstack" / "state.json"
    backend = LocalBackend(path)
    rng = random.Random(1234)
    serial, mid_write = 0, 0
    for _ in range(25):
        started = CTX.Event()
        proc = CTX.Process(target=_write_forever, args=(path, started))
        proc.start()
        assert started.wait(NET)
        time.sleep(rng.uniform(0, 0.03))
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        proc.join(NET)
        assert proc.exitcode == -signal.SIGKILL
        state = parse_state(path.read_bytes(), path)  # the old or the new version, whole
        assert state.serial >= serial and state.serial >= 1
        serial = state.serial
        parse_state(backend.backup_path.read_bytes(), backend.backup_path)
        mid_write += bool(leftover_temp_files(path))
    print(f"{mid_write}/25 kills left a temp file behind; final serial {serial}")
    after = commit(backend, lambda s: s.with_resource(entry("task.final")))
    assert after.state.serial == serial + 1
    assert leftover_temp_files(path) == [] and leftover_temp_files(backend.backup_path) == []
