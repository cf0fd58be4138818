"""The backend contract without files: CAS commits, lock waits with backoff, lock records.

`MemoryBackend` is the smallest backend that honours the contract the way the S3 one will:
an opaque version token and a lock record with an expiry that others may take over.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import datetime, timezone

import pytest

from dstack_plan.clock import Clock, FakeClock
from dstack_plan.errors import LockError, StateError
from dstack_plan.state import (
    ABSENT,
    LockHandle,
    LockInfo,
    ResourceState,
    SecretGuard,
    State,
    StateBackend,
    StateConflictError,
    StateSnapshot,
    acquire_with_backoff,
    commit,
    commit_async,
    hold_lock,
    prepare_write,
)
from dstack_plan.state.lock import lock_held_error
from tests.infra.recording_clock import RecordingClock

NOW = datetime(2025, 1, 2, tzinfo=timezone.utc)


class MemoryLockHandle(LockHandle):
    def __init__(self, backend: MemoryBackend, info: LockInfo, ttl: float, clock: Clock):
        super().__init__(info, ttl=ttl, clock=clock)
        self.backend = backend

    def _store_renewal(self, info: LockInfo) -> None:
        if self.backend.lock_record is None or self.backend.lock_record.id != info.id:
            raise LockError("lock was taken over", self.backend.lock_record)
        self.backend.lock_record = info

    def _release(self) -> None:
        if self.backend.lock_record is not None and self.backend.lock_record.id == self.info.id:
            self.backend.lock_record = None


class MemoryBackend(StateBackend):
    def __init__(self, secret_guard: SecretGuard | None = None) -> None:
        self.stored: State | None = None
        self.etags = itertools.count(1)
        self.etag = ABSENT
        self.writes = 0
        self.before_write: Callable[[], None] | None = None
        self.lock_record: LockInfo | None = None
        self.secret_guard = secret_guard if secret_guard is not None else SecretGuard()

    @property
    def location(self) -> str:
        return "memory://state"

    def read(self) -> StateSnapshot:
        return StateSnapshot(self.stored or State.empty(), self.etag)

    def write(self, new_state: State, expected: str) -> StateSnapshot:
        self.secret_guard.check(new_state)
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()
        if self.etag != expected:
            raise StateConflictError(
                f"state changed since it was read: etag {self.etag}, expected {expected}",
                current=self.etag,
                expected=expected,
            )
        to_write = prepare_write(self.stored, new_state, self.location)
        if to_write is None:
            return self.read()
        self.stored, self.etag = to_write, f"etag-{next(self.etags)}"
        self.writes += 1
        return self.read()

    def try_lock(self, operation: str, who: str, ttl: float, clock: Clock) -> LockHandle:
        held = self.lock_record
        if held is not None and not held.is_expired(clock.now()):
            raise lock_held_error(self.location, held)
        info = LockInfo.new(
            operation=operation, who=who, path=self.location, ttl=ttl, clock=clock, pid=None
        )
        self.lock_record = info
        return MemoryLockHandle(self, info, ttl, clock)

    def unlock(self, lock_id: str) -> None:
        if self.lock_record is None or self.lock_record.id != lock_id:
            raise LockError(f"no lock {lock_id}", self.lock_record)
        self.lock_record = None

    def read_lock_info(self) -> LockInfo | None:
        return self.lock_record


def add(address: str, **spec: object) -> Callable[[State], State]:
    def mutate(state: State) -> State:
        rs = ResourceState.create(address, provider="local", spec=spec, status="ok", now=NOW)
        return state.with_resource(rs)

    return mutate


class TestCommit:
    def test_first_commit_creates_serial_one(self) -> None:
        backend = MemoryBackend()
        snap = commit(backend, add("fleet.a"))
        assert snap.state.serial == 1 and snap.exists
        assert backend.read().state == snap.state

    def test_conflict_is_retried_with_the_mutation_reapplied(self) -> None:
        backend = MemoryBackend()
        commit(backend, add("fleet.a"))
        # Someone else commits between our read and our write.
        backend.before_write = lambda: commit(backend, add("volume.v"))
        snap = commit(backend, add("task.t"))
        assert snap.state.addresses == ["fleet.a", "task.t", "volume.v"]
        assert snap.state.serial == 3

    def test_gives_up_after_bounded_attempts(self) -> None:
        backend = MemoryBackend()
        real_write = backend.write

        def always_raced(state: State, expected: str) -> StateSnapshot:
            backend.etag = f"other-{next(backend.etags)}"
            return real_write(state, expected)

        backend.write = always_raced  # type: ignore[method-assign]
        pauses: list[float] = []
        with pytest.raises(StateConflictError, match="gave up after 3 attempts"):
            commit(backend, add("fleet.a"), attempts=3, pause=pauses.append)
        assert len(pauses) == 2 and all(0 <= p <= 0.25 for p in pauses)

    def test_noop_mutation_does_not_write(self) -> None:
        backend = MemoryBackend()
        first = commit(backend, add("fleet.a", nodes=1))
        again = commit(backend, add("fleet.a", nodes=1))
        assert again == first and backend.writes == 1
        assert commit(backend, lambda s: s).state.serial == 1

    def test_direct_write_of_same_content_keeps_serial(self) -> None:
        backend = MemoryBackend()
        snap = commit(backend, add("fleet.a"))
        same = backend.write(snap.state, snap.version)
        assert same.version == snap.version and same.state.serial == 1
        assert backend.writes == 1

    def test_stale_snapshot_write_raises_conflict(self) -> None:
        backend = MemoryBackend()
        stale = backend.read()
        commit(backend, add("fleet.a"))
        with pytest.raises(StateConflictError, match="state changed since it was read"):
            backend.write(add("task.b")(stale.state), stale.version)

    def test_commit_async(self) -> None:
        backend = MemoryBackend()
        snap = asyncio.run(commit_async(backend, add("fleet.a")))
        assert snap.state.addresses == ["fleet.a"]

    def test_secret_guard_refuses_write(self) -> None:
        backend = MemoryBackend(SecretGuard(["hunter2-token"]))
        with pytest.raises(StateError, match=r'resources\["task.t"\].spec.env.TOKEN contains'):
            commit(backend, add("task.t", env={"TOKEN": "hunter2-token"}))
        assert backend.writes == 0


def held(holder: LockInfo | None = None) -> LockError:
    return lock_held_error("memory://state", holder)


class TestBackoff:
    def test_sleeps_double_from_half_a_second_capped_at_eight_until_timeout(self) -> None:
        clock = RecordingClock()
        attempts = 0

        def attempt() -> None:
            nonlocal attempts
            attempts += 1
            raise held()

        with pytest.raises(LockError, match="Gave up after waiting 30s"):
            asyncio.run(acquire_with_backoff(attempt, timeout=30, clock=clock))
        assert clock.sleeps == [0.5, 1, 2, 4, 8, 8, 6.5]
        assert attempts == len(clock.sleeps) + 1

    def test_zero_timeout_tries_once(self) -> None:
        clock = RecordingClock()
        with pytest.raises(LockError) as info:
            asyncio.run(
                acquire_with_backoff(lambda: (_ for _ in ()).throw(held()), timeout=0, clock=clock)
            )
        assert clock.sleeps == [] and "Gave up" not in str(info.value)

    def test_succeeds_once_the_holder_is_gone(self) -> None:
        clock = RecordingClock()
        free_at = clock.now() + 3

        def attempt() -> str:
            if clock.now() < free_at:
                raise held()
            return "got it"

        assert asyncio.run(acquire_with_backoff(attempt, timeout=60, clock=clock)) == "got it"
        assert clock.sleeps == [0.5, 1, 2]

    def test_other_errors_are_not_retried(self) -> None:
        clock = RecordingClock()

        def attempt() -> None:
            raise StateError("disk on fire")

        with pytest.raises(StateError, match="disk on fire"):
            asyncio.run(acquire_with_backoff(attempt, timeout=60, clock=clock))
        assert clock.sleeps == []


class TestLocking:
    def test_contention_error_shows_holder(self) -> None:
        backend = MemoryBackend()
        clock = FakeClock()
        first = asyncio.run(backend.lock("apply", who="alice@ci", clock=clock))
        with pytest.raises(LockError) as info:
            asyncio.run(backend.lock("destroy", who="bob@laptop", clock=clock))
        message = str(info.value)
        assert info.value.holder == first.info
        for expected in (first.info.id, "Operation: apply", "Who:       alice@ci", "Created:"):
            assert expected in message
        first.release()
        first.release()  # idempotent
        assert backend.read_lock_info() is None

    def test_default_who_is_user_at_host(self) -> None:
        backend = MemoryBackend()
        handle = asyncio.run(backend.lock("apply", clock=FakeClock()))
        assert "@" in handle.info.who

    def test_expired_lock_can_be_taken_over_and_renew_then_fails(self) -> None:
        backend = MemoryBackend()
        clock = FakeClock()
        stuck = asyncio.run(backend.lock("apply", clock=clock, ttl=60))
        clock.advance(30)
        assert stuck.renew().expires.timestamp() == clock.now() + 60
        clock.advance(61)
        rescuer = asyncio.run(backend.lock("apply", clock=clock, ttl=60))
        assert backend.read_lock_info() == rescuer.info
        with pytest.raises(LockError, match="taken over"):
            stuck.renew()

    def test_hold_lock_releases_on_error(self) -> None:
        backend = MemoryBackend()

        async def body() -> None:
            async with hold_lock(backend, "apply", clock=FakeClock(), renew=False) as handle:
                assert backend.read_lock_info() == handle.info
                raise RuntimeError("apply failed")

        with pytest.raises(RuntimeError):
            asyncio.run(body())
        assert backend.read_lock_info() is None

    def test_lock_info_json_round_trip_and_tolerance(self) -> None:
        info = LockInfo.new(
            operation="apply", who="a@b", path="p", ttl=10, clock=FakeClock(), pid=7
        )
        assert LockInfo.parse(info.to_json()) == info
        assert LockInfo.parse(info.to_json().replace('"id"', '"future": 1, "id"')) == info
        assert LockInfo.parse(b"") is None and LockInfo.parse(b"{garbage") is None
        assert not info.is_expired(FakeClock().now() + 9)
        assert info.is_expired(FakeClock().now() + 10)
