"""The local backend's journal (`state/journal.py`): a commit into a large state appends what
changed instead of rewriting the file, and every reader sees it.

The guarantees of the whole-file writes hold in journal mode too, across real processes:
concurrent writers lose nothing, a kill -9 at any moment leaves a state that parses (read
the way every command reads it, through the backend) and the next commit continues from it.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from pathlib import Path

import pytest

from dstack_plan.errors import StateError
from dstack_plan.state import LocalBackend, SecretGuard, State, commit, local, parse_state
from dstack_plan.state.local import JOURNAL_ENV
from tests.integration import test_state_local_processes as whole_file
from tests.integration.test_state_local_processes import CTX, NET, entry

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _journal_every_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Journal from the first byte, so small states take the journal's path (forked
    children inherit the environment)."""
    monkeypatch.setenv(JOURNAL_ENV, "0")


def _fill(backend: LocalBackend, count: int, padding: int = 100) -> State:
    state = backend.read().state
    for i in range(count):
        state = state.with_resource(entry(f"task.t{i:05d}", i=i, pad="x" * padding))
    return commit(backend, lambda _s: state).state


def _drop(state: State, numbers: range) -> State:
    for i in numbers:
        state = state.without(f"task.t{i:05d}")
    return state


def test_a_commit_appends_what_changed_and_a_fresh_reader_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    _fill(backend, 2000)
    file_bytes = path.stat().st_size
    assert not backend.journal_path.exists()  # the first write is whole

    after = commit(backend, lambda s: s.with_resource(entry("task.t00007", i=7, changed=True)))
    after = commit(backend, lambda s: s.without("task.t00008"))
    assert path.stat().st_size == file_bytes  # the state file was not rewritten
    assert backend.journal_path.stat().st_size < 2000  # two small lines
    assert oct(backend.journal_path.stat().st_mode & 0o777) == "0o600"

    fresh = LocalBackend(path).read()
    assert fresh.version == after.version == "3"
    assert fresh.state == after.state
    assert fresh.state.get("task.t00007").spec["changed"] is True  # type: ignore[union-attr]
    assert fresh.state.get("task.t00008") is None
    # the state file alone is an older committed version, whole
    assert parse_state(path.read_bytes(), path).serial == 1


def test_the_journal_is_folded_in_once_it_is_as_large_as_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    _fill(backend, 50)
    serials = []
    for i in range(400):
        done = commit(backend, lambda s, i=i: s.with_resource(entry(f"task.t{i % 50:05d}", n=i)))
        serials.append(done.state.serial)
        journal = backend.journal_path
        assert not journal.exists() or journal.stat().st_size <= path.stat().st_size
    assert serials == list(range(2, 402))  # one serial per commit, whichever way it went
    written_whole = parse_state(path.read_bytes(), path).serial
    assert 1 < written_whole <= 401  # folded at least once
    assert (
        parse_state(backend.backup_path.read_bytes(), backend.backup_path).serial < written_whole
    )
    assert LocalBackend(path).read().state == done.state
    assert [v.serial for v in LocalBackend(path).history() if v.current] == [401]


def test_compact_folds_a_journal_of_an_eighth_of_the_file_and_keeps_the_serial(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    _fill(backend, 2000, padding=400)
    commit(backend, lambda s: s.with_resource(entry("task.t00001", n=1)))
    backend.compact()  # a line or two: not worth rewriting the file for
    assert backend.journal_path.exists()
    n = 0
    while backend.journal_path.stat().st_size * 8 < path.stat().st_size:
        n += 1
        done = commit(
            backend, lambda s, n=n: s.with_resource(entry("task.t00003", n=n, p="y" * 400))
        )
    before_file = parse_state(path.read_bytes(), path).serial
    assert before_file < done.state.serial  # the newest commits are in the journal only
    LocalBackend(path).compact()  # another process (an apply's end) compacts
    assert not backend.journal_path.exists()
    on_disk = parse_state(path.read_bytes(), path)
    assert on_disk == done.state and on_disk.serial == done.state.serial
    assert backend.read().state == done.state  # a reader that had replayed the journal
    after = commit(backend, lambda s: s.with_resource(entry("task.t00002", n=2)))
    assert after.state.serial == done.state.serial + 1
    assert LocalBackend(path).read().state == after.state


def test_compact_folds_a_journal_that_deleted_half_the_file(tmp_path: Path) -> None:
    # After a destroy, the journal of deletions is small beside the file, yet every reader
    # would parse the file's dead entries: once half are gone, the end of the command folds.
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    _fill(backend, 2000)
    commit(backend, lambda s: _drop(s, range(900)))
    backend.compact()  # 1,100 of 2,000 left: the file is mostly alive
    assert backend.journal_path.exists()
    done = commit(backend, lambda s: _drop(s, range(900, 1000)))
    assert backend.journal_path.stat().st_size * 8 < path.stat().st_size  # a small journal
    backend.compact()  # 1,000 of 2,000 left
    assert not backend.journal_path.exists()
    on_disk = parse_state(path.read_bytes(), path)
    assert on_disk == done.state and len(on_disk.resources) == 1000
    assert LocalBackend(path).read().state == done.state


def test_a_torn_last_line_is_ignored_and_cut_off_by_the_next_commit(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    _fill(backend, 100)
    kept = commit(backend, lambda s: s.with_resource(entry("task.kept", ok=True)))
    journal = backend.journal_path.read_bytes()
    with backend.journal_path.open("ab") as f:  # a kill -9 in the middle of an append
        f.write(journal[: len(journal) // 2])
    assert LocalBackend(path).read().state == kept.state

    with backend.journal_path.open("ab") as f:  # a whole line that does not check out
        f.write(journal.replace(b'"ok":true', b'"ok":fals'))
    assert LocalBackend(path).read().state == kept.state

    later = commit(LocalBackend(path), lambda s: s.with_resource(entry("task.later")))
    assert later.state.serial == kept.state.serial + 1
    assert LocalBackend(path).read().state == later.state
    assert b'"ok":fals' not in backend.journal_path.read_bytes()


def test_lines_a_fold_took_in_already_are_skipped(tmp_path: Path) -> None:
    """A fold killed after it wrote the state file but before it emptied the journal."""
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    _fill(backend, 100)
    commit(backend, lambda s: s.with_resource(entry("task.a")))
    leftover = backend.journal_path.read_bytes()
    folded = commit(backend, lambda s: s, attempts=1)  # nothing to change: no write
    state = folded.state.with_resource(entry("task.b"))
    backend._replace(state.model_copy(update={"serial": 3}), keep_backup=True)  # a fold
    backend.journal_path.write_bytes(leftover)  # ... killed before the journal was emptied
    fresh = LocalBackend(path)
    assert fresh.read().state.serial == 3 and fresh.read().state.get("task.b") is not None
    after = commit(fresh, lambda s: s.with_resource(entry("task.c")))
    assert after.state.serial == 4
    assert set(LocalBackend(path).read().state.resources) >= {"task.a", "task.b", "task.c"}


def test_a_secret_in_a_journaled_change_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    guard = SecretGuard(["hunter2-secret"])
    backend = LocalBackend(path, secret_guard=guard)
    _fill(backend, 100)
    before = backend.journal_path.exists() and backend.journal_path.read_bytes()
    with pytest.raises(StateError, match="contains the value of a secret"):
        commit(backend, lambda s: s.with_resource(entry("task.leak", env="x hunter2-secret")))
    assert (backend.journal_path.exists() and backend.journal_path.read_bytes()) == before
    assert LocalBackend(path).read().state.get("task.leak") is None


def test_concurrent_writers_lose_nothing_in_journal_mode(tmp_path: Path) -> None:
    whole_file.test_concurrent_read_modify_write_loses_nothing(tmp_path, optimistic=False)
    assert (tmp_path / ".dstack" / "state.json.journal").exists()


def test_concurrent_cas_writers_lose_nothing_in_journal_mode(tmp_path: Path) -> None:
    whole_file.test_concurrent_read_modify_write_loses_nothing(tmp_path, optimistic=True)


def _commit_forever(path: Path, started: object) -> None:
    backend = LocalBackend(path)

    def bump(state: State) -> State:
        counter = state.serial + 1  # carries on from the previous (killed) writer
        return state.with_resource(entry(f"task.r{counter % 20}", counter=counter))

    while True:
        commit(backend, bump)
        started.set()  # type: ignore[attr-defined]


def test_kill_minus_nine_mid_commit_keeps_a_state_the_next_commit_continues(
    tmp_path: Path,
) -> None:
    path = tmp_path / ".dstack" / "state.json"
    rng = random.Random(4321)
    serial = 0
    for _ in range(25):
        started = CTX.Event()
        proc = CTX.Process(target=_commit_forever, args=(path, started))
        proc.start()
        assert started.wait(NET)
        time.sleep(rng.uniform(0, 0.03))
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        proc.join(NET)
        assert proc.exitcode == -signal.SIGKILL
        state = LocalBackend(path).read().state  # as every command reads it
        assert state.serial >= max(serial, 1)
        for address, resource in state.resources.items():  # each commit whole, none lost
            assert resource.spec["counter"] <= state.serial, address
        assert {r.spec["counter"] for r in state.resources.values()} >= {state.serial}
        serial = state.serial
    after = commit(LocalBackend(path), lambda s: s.with_resource(entry("task.final")))
    assert after.state.serial == serial + 1
    assert LocalBackend(path).read().state == after.state


def test_a_failed_append_leaves_the_state_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    _fill(backend, 100)
    before = commit(backend, lambda s: s.with_resource(entry("task.before")))

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(local.os, "fsync", disk_full)
        with pytest.raises(StateError, match="cannot write state: .*No space left"):
            commit(backend, lambda s: s.with_resource(entry("task.lost")))
    assert backend.journal_path.exists()  # the journal's path was taken
    assert LocalBackend(path).read().state == before.state
    after = commit(backend, lambda s: s.with_resource(entry("task.after")))
    assert after.state.serial == before.state.serial + 1
    assert LocalBackend(path).read().state == after.state


def test_a_reader_that_saw_a_folded_journal_reads_the_next_one_whole(tmp_path: Path) -> None:
    """A reader can find the journal a fold took in still there (read between the fold's
    rename and its unlink): every line is already in the file. The next journal may get the
    freed inode number back, so that reader must not read on from the old one's length in
    the new one (it would miss commits and, writing, cut them off). Inode reuse is played
    here by emptying the very file in place."""
    path = tmp_path / "state.json"
    writer = LocalBackend(path)
    _fill(writer, 20)
    for i in range(3):
        commit(writer, lambda s, i=i: s.with_resource(entry(f"task.a{i}", i=i)))
    folded_lines = writer.journal_path.read_bytes()
    with writer.exclusive():  # a fold (compact folds only a large journal: by hand here)
        writer._replace(writer.read().state, keep_backup=True)
    # ... and the reader comes before the fold removes the journal
    reader = LocalBackend(path)
    assert reader.read().state.serial == writer.read().state.serial == 4
    with writer.journal_path.open("r+b") as f:  # the next journal, on the same inode
        f.truncate(0)
    assert writer.journal_path.read_bytes() == b""
    for i in range(6):  # more than the old one held, so the reader could read on
        commit(writer, lambda s, i=i: s.with_resource(entry(f"task.b{i}", i=i, pad="y" * 50)))
    assert writer.journal_path.stat().st_size > len(folded_lines)

    seen = reader.read()
    assert seen.state.serial == 10
    assert {f"task.b{i}" for i in range(6)} <= set(seen.state.resources)
    # and a commit through that reader loses none of them
    commit(reader, lambda s: s.with_resource(entry("task.c")))
    final = LocalBackend(path).read().state
    assert final.serial == 11
    assert {f"task.b{i}" for i in range(6)} | {"task.c"} <= set(final.resources)
