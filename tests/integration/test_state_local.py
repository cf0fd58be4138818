"""The local backend on a real filesystem, within one process: files, modes, CAS, locks."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock, SystemClock
from dstack_plan.config import atomic
from dstack_plan.errors import LockError, StateError
from dstack_plan.state import (
    ABSENT,
    LocalBackend,
    ResourceState,
    SecretGuard,
    State,
    StateConflictError,
    commit,
    commit_async,
    hold_lock,
    parse_state,
)

NOW = datetime(2025, 1, 2, tzinfo=timezone.utc)


def add(address: str, **spec: object) -> Callable[[State], State]:
    def mutate(state: State) -> State:
        rs = ResourceState.create(address, provider="local", spec=spec, status="ok", now=NOW)
        return state.with_resource(rs)

    return mutate


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend.for_project(tmp_path)


@pytest.fixture
def open_umask() -> Iterator[None]:
    # The most permissive umask: modes must come from the code, not the environment.
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


class TestFiles:
    def test_missing_state_reads_empty_without_creating_anything(
        self, backend: LocalBackend, tmp_path: Path
    ) -> None:
        snap = backend.read()
        assert snap.version == ABSENT and not snap.exists
        assert snap.state.resources == {} and snap.state.serial == 0
        assert backend.read_lock_info() is None
        assert list(tmp_path.iterdir()) == []

    def test_write_creates_private_files_and_keeps_backup(
        self, backend: LocalBackend, open_umask: None
    ) -> None:
        first = commit(backend, add("fleet.a"))
        assert first.version == "1" and backend.path.exists()
        assert mode(backend.path) == 0o600
        assert mode(backend.path.parent) == 0o700
        assert not backend.backup_path.exists()  # nothing to back up on the first write

        second = commit(backend, add("task.b"))
        assert second.version == "2" and mode(backend.path) == 0o600
        assert mode(backend.backup_path) == 0o600
        assert parse_state(backend.backup_path.read_bytes(), "b") == first.state
        assert parse_state(backend.path.read_bytes(), "s") == second.state
        assert backend.path.read_text() == second.state.to_json()

        commit(backend, lambda s: s.without("fleet.a"))
        assert parse_state(backend.backup_path.read_bytes(), "b") == second.state

    def test_temp_file_is_private_before_any_byte_is_written(
        self, backend: LocalBackend, open_umask: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen: list[int] = []
        real_write = os.write

        def spying_write(fd: int, data: bytes) -> int:
            seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
            return real_write(fd, data)

        monkeypatch.setattr(atomic.os, "write", spying_write)
        commit(backend, add("fleet.a"))
        commit(backend, add("fleet.b"))
        assert seen and set(seen) == {0o600}

    def test_hand_made_world_readable_state_is_replaced_private(
        self, backend: LocalBackend, open_umask: None
    ) -> None:
        commit(backend, add("fleet.a"))
        os.chmod(backend.path, 0o644)
        commit(backend, add("fleet.b"))
        assert mode(backend.path) == 0o600 and mode(backend.backup_path) == 0o600

    def test_identical_write_touches_nothing(self, backend: LocalBackend) -> None:
        snap = commit(backend, add("fleet.a"))
        before = backend.path.stat()
        again = backend.write(snap.state, snap.version)
        assert again == snap
        after = backend.path.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert not backend.backup_path.exists()

    def test_empty_state_over_missing_file_writes_nothing(
        self, backend: LocalBackend, tmp_path: Path
    ) -> None:
        snap = backend.read()
        assert backend.write(snap.state, snap.version).version == ABSENT
        assert not backend.path.exists()

    def test_leftover_temp_files_are_cleaned_by_the_next_write(
        self, backend: LocalBackend
    ) -> None:
        commit(backend, add("fleet.a"))
        leftover = atomic.temp_path_for(backend.path)
        leftover.write_text("half a stat")
        commit(backend, add("fleet.b"))
        assert not leftover.exists()

    def test_corrupt_file_error_names_path_and_backup(self, backend: LocalBackend) -> None:
        commit(backend, add("fleet.a"))
        commit(backend, add("fleet.b"))
        backend.path.write_text('{"format_version": 1, "lineage": ')
        with pytest.raises(StateError) as info:
            backend.read()
        message = str(info.value)
        assert message.startswith(f"{backend.path}: state file is not valid JSON")
        assert f"previous version is in {backend.backup_path}" in message
        with pytest.raises(StateError):  # no CAS against a state we cannot read
            backend.write(State.empty(), "2")

    def test_newer_format_refused(self, backend: LocalBackend) -> None:
        backend.path.parent.mkdir(parents=True)
        data = json.loads(State.empty().to_json()) | {"format_version": 9}
        backend.path.write_text(json.dumps(data))
        with pytest.raises(StateError, match="format_version 9 is newer"):
            backend.read()

    def test_unreadable_path(self, backend: LocalBackend) -> None:
        backend.path.mkdir(parents=True)
        with pytest.raises(StateError, match="cannot read state"):
            backend.read()

    def test_failed_write_leaves_old_state_intact(
        self, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        first = commit(backend, add("fleet.a"))

        def disk_full(src: object, dst: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(atomic.os, "replace", disk_full)
        with pytest.raises(StateError, match="cannot write state: .*No space left"):
            commit(backend, add("fleet.b"))
        monkeypatch.undo()
        assert backend.read() == first
        assert atomic.leftover_temp_files(backend.path) == []
        assert atomic.leftover_temp_files(backend.backup_path) == []

    def test_secret_guard_blocks_the_write(self, tmp_path: Path) -> None:
        guard = SecretGuard()
        backend = LocalBackend(tmp_path / "s.json", secret_guard=guard)
        commit(backend, add("task.t", env={"TOKEN": "${{ secrets.TOKEN }}"}))
        guard.register("sk-live-12345")
        with pytest.raises(StateError, match="contains the value of a secret"):
            commit(backend, add("task.t", env={"TOKEN": "sk-live-12345"}))
        assert "sk-live-12345" not in backend.path.read_text()


class TestCompareAndSwap:
    def test_racing_snapshots_second_writer_gets_conflict(self, backend: LocalBackend) -> None:
        commit(backend, add("fleet.a"))
        mine, theirs = backend.read(), backend.read()
        backend.write(add("task.theirs")(theirs.state), theirs.version)
        with pytest.raises(StateConflictError) as info:
            backend.write(add("task.mine")(mine.state), mine.version)
        assert "state changed since it was read: serial 2, expected 1" in str(info.value)
        assert backend.read().state.addresses == ["fleet.a", "task.theirs"]

    def test_two_first_writers_race_on_a_missing_file(self, backend: LocalBackend) -> None:
        one, two = backend.read(), backend.read()
        assert one.state.lineage != two.state.lineage
        backend.write(add("fleet.a")(one.state), one.version)
        with pytest.raises(StateConflictError, match="serial 1, expected absent"):
            backend.write(add("fleet.b")(two.state), two.version)

    def test_serial_and_lineage_across_writes(self, backend: LocalBackend) -> None:
        lineage = commit(backend, add("fleet.a")).state.lineage
        for i in range(5):
            commit(backend, add("fleet.a", nodes=i + 1))
            commit(backend, add("fleet.a", nodes=i + 1))  # no change, no serial
        snap = backend.read()
        assert snap.state.serial == 6 and snap.state.lineage == lineage

    def test_foreign_lineage_refused(self, backend: LocalBackend) -> None:
        snap = commit(backend, add("fleet.a"))
        foreign = add("fleet.a")(State.empty())
        with pytest.raises(StateError, match="unrelated state"):
            backend.write(foreign, snap.version)

    def test_parallel_async_commits_in_one_process(self, backend: LocalBackend) -> None:
        # apply commits after every resource from parallel tasks, through worker threads.
        async def many() -> None:
            await asyncio.gather(*(commit_async(backend, add(f"task.t{i}")) for i in range(40)))

        asyncio.run(many())
        state = backend.read().state
        assert state.serial == 40 and len(state.resources) == 40


class TestOperationLock:
    def test_lock_info_file_and_contention_message(self, backend: LocalBackend) -> None:
        clock = FakeClock()
        handle = asyncio.run(backend.lock("apply", who="alice@ci", clock=clock, ttl=60))
        assert mode(backend.lock_info_path) == 0o600
        on_disk = json.loads(backend.lock_info_path.read_text())
        assert set(on_disk) >= {"id", "operation", "who", "created", "expires", "path"}
        assert on_disk["path"] == str(backend.path) and on_disk["pid"] == os.getpid()
        assert backend.read_lock_info() == handle.info

        # flock excludes other open files even within one process.
        with pytest.raises(LockError) as info:
            asyncio.run(backend.lock("destroy", who="bob@laptop", clock=clock))
        assert info.value.holder == handle.info
        assert "Lock Info:" in str(info.value) and handle.info.id in str(info.value)

        renewed = handle.renew()
        assert LocalBackend(backend.path).read_lock_info() == renewed
        handle.release()
        assert not backend.lock_info_path.exists()
        assert backend.read_lock_info() is None
        asyncio.run(backend.lock("destroy", clock=clock)).release()

    def test_reads_and_writes_do_not_need_the_operation_lock(self, backend: LocalBackend) -> None:
        # watch commits small updates while apply holds the lock.
        with asyncio.run(backend.lock("apply", clock=FakeClock())):
            assert commit(backend, add("fleet.a")).state.serial == 1

    def test_force_unlock_of_live_local_lock_refused(self, backend: LocalBackend) -> None:
        handle = asyncio.run(backend.lock("apply", clock=FakeClock()))
        with pytest.raises(LockError, match="held by a running process"):
            backend.unlock(handle.info.id)
        handle.release()
        with pytest.raises(LockError, match="is not locked"):
            backend.unlock(handle.info.id)

    def test_hold_lock_renews_in_background(self, backend: LocalBackend) -> None:
        async def body() -> tuple[datetime, datetime]:
            async with hold_lock(backend, "apply", clock=SystemClock(), ttl=0.06) as handle:
                first = handle.info.expires
                await asyncio.sleep(0.1)
                return first, backend.read_lock_info().expires  # type: ignore[union-attr]

        first, later = asyncio.run(body())
        assert later > first
        assert backend.read_lock_info() is None
