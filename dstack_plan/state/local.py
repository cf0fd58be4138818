"""The `local` backend: a JSON file on this machine, written atomically, locked with flock.

Files next to the state file (default `.dstack/state.json`):
- `state.json.backup`: the previous version, replaced on every content-changing write;
- `state.json.history/<serial>.json`: the last 20 versions, hard links to the inodes each
  write leaves behind (no copy, so a commit costs the same at any size); `dstack state
  history` lists them (`state/local_history.py`);
- `state.json.journal`: the commits since the state file was last written whole, one line
  each, once the state is large (`state/journal.py`): a commit appends what it changed, and
  the state file is rewritten (folding the journal in) when the journal has grown as large;
- `state.json.lock`: flocked for the few milliseconds of each compare-and-swap write, so
  writers in different processes serialise (reads need no lock: renames are atomic);
- `.state.json.lock.info`: flocked for the whole operation by apply/destroy, holding the
  lock record. The OS drops flocks when a process dies, so a killed holder blocks nobody.
- watch's records (`events.jsonl`, `watch-lease.json`), each with its own `.lock`: see
  `state/local_records.py`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from dstack_plan.clock import Clock
from dstack_plan.config.atomic import (
    PRIVATE_MODE,
    fsync_dir,
    leftover_temp_files,
    temp_path_for,
    write_private_atomic,
)
from dstack_plan.errors import LockError, StateError
from dstack_plan.state import importing, local_history, local_records
from dstack_plan.state.backend import (
    ABSENT,
    StateBackend,
    StateConflictError,
    StateSnapshot,
    StateVersion,
    prepare_write,
)
from dstack_plan.state.codec import parse_state
from dstack_plan.state.journal import Replayed, change_of, encode, replay
from dstack_plan.state.lock import LockHandle, LockInfo, lock_held_error
from dstack_plan.state.model import State
from dstack_plan.state.records import RecordSnapshot
from dstack_plan.state.render import Renderer
from dstack_plan.state.secrets import SecretGuard

log = logging.getLogger(__name__)

DEFAULT_STATE_PATH = Path(".dstack") / "state.json"
STATE_ENV = "DSTACK_STATE"
"""Where the state file is when no `--state` is given (default: `.dstack/state.json` of the
project directory)."""


def state_path(project_dir: str | Path, explicit: str | Path | None = None) -> Path:
    """The state file of the project in `project_dir`: `explicit`, else $DSTACK_STATE, else
    `.dstack/state.json` there."""
    return Path(explicit or os.environ.get(STATE_ENV) or Path(project_dir) / DEFAULT_STATE_PATH)


JOURNAL_ENV = "DSTACK_PLAN_STATE_JOURNAL_FROM_BYTES"
"""Overrides `JOURNAL_FROM_BYTES` (0: journal every commit; tests of the journal use it)."""
JOURNAL_FROM_BYTES = 512 * 1024
"""A state file smaller than this is rewritten whole on every commit, as it costs little
(about 300 runs: a few milliseconds); from this size on, commits go to the journal."""
COMPACT_FRACTION = 8
COMPACT_FROM_BYTES = 64 * 1024
"""`compact` folds a journal once it holds 1/COMPACT_FRACTION of the state file's bytes and
at least COMPACT_FROM_BYTES: a reader replays it line by line, several times slower per byte
than the file's parse, but a smaller one costs a reader under a millisecond."""


def journal_from_bytes() -> int:
    """The state file size from which commits are journaled ($DSTACK_PLAN_STATE_JOURNAL_FROM_BYTES
    or `JOURNAL_FROM_BYTES`)."""
    raw = os.environ.get(JOURNAL_ENV, "").strip()
    return int(raw) if raw.isdigit() else JOURNAL_FROM_BYTES


@dataclass(frozen=True)
class _Journaled:
    """The journal as last read on top of one state file: what a reader saw and where the
    next line goes."""

    base: tuple[int, int, int, int]
    """The state file's identity it continues."""
    journal: tuple[int, int]
    """The journal's device and inode."""
    size: int
    """Bytes of the journal read."""
    replayed: Replayed


_WOULD_BLOCK = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)
_MAX_LOCK_FILE_RACES = 10


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _try_flock(fd: int, operation: int) -> bool:
    """flock without blocking; False when another open file holds a conflicting lock."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in _WOULD_BLOCK:
            return False
        raise
    return True


def _is_current(fd: int, path: Path) -> bool:
    """True if `path` still names the file open as `fd` (not unlinked or replaced)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)


def _read_lock_record(fd: int) -> LockInfo | None:
    return LockInfo.parse(os.pread(fd, 1 << 16, 0))


_RECORD_WAIT = (0.01, 0.02, 0.04, 0.08)
"""Pauses before re-reading a holder's record that is not written yet: a holder writes it
right after it takes the lock, so one that raced us is named rather than `not readable`."""


def _holder_record(fd: int) -> LockInfo | None:
    """The record of the process holding the lock on `fd`, waiting a moment for it."""
    info = _read_lock_record(fd)
    for pause in _RECORD_WAIT:
        if info is not None:
            break
        time.sleep(pause)
        info = _read_lock_record(fd)
    return info


def _write_lock_record(fd: int, info: LockInfo) -> None:
    data = info.to_json().encode("utf-8")
    # Overwrite in place, padding over the old record, then trim: a concurrent reader sees
    # the old or the new JSON (trailing spaces are valid JSON), not an empty file. No fsync:
    # the record is only meaningful while the process holding the flock is alive.
    old_size = os.fstat(fd).st_size
    os.pwrite(fd, data.ljust(old_size, b" "), 0)
    os.ftruncate(fd, len(data))


class LocalLockHandle(LockHandle):
    """The operation lock held through an open, flocked `.state.json.lock.info`."""

    def __init__(self, fd: int, path: Path, info: LockInfo, *, ttl: float, clock: Clock):
        super().__init__(info, ttl=ttl, clock=clock)
        self._fd = fd
        self._path = path

    def _store_renewal(self, info: LockInfo) -> None:
        _write_lock_record(self._fd, info)

    def _release(self) -> None:
        try:
            # Unlink while still locked: a process that opened the old file and then gets
            # the lock sees it is no longer at the path and starts over.
            if _is_current(self._fd, self._path):
                self._path.unlink()
        finally:
            os.close(self._fd)


class LocalBackend(StateBackend):
    """State in a local file (default `.dstack/state.json`); see the module docstring."""

    def __init__(self, path: str | Path, *, secret_guard: SecretGuard | None = None) -> None:
        self.path = Path(path)
        self.secret_guard = secret_guard if secret_guard is not None else SecretGuard()
        self.backup_path = self.path.with_name(self.path.name + ".backup")
        self.write_lock_path = self.path.with_name(self.path.name + ".lock")
        self.lock_info_path = self.path.with_name(f".{self.path.name}.lock.info")
        self.history_dir = local_history.history_dir(self.path)
        self.journal_path = self.path.with_name(self.path.name + ".journal")
        self._journaled: _Journaled | None = None
        self._thread = threading.local()
        self._parsed: tuple[tuple[int, int, int, int], State] | None = None
        """The file as last read or written: its identity (device, inode, size, mtime) and
        the state in it. A commit reads the state twice (to change it, then to check
        nobody wrote in between), and a 10,000-resource state takes half a second to
        parse; an unchanged file is not parsed again. Writes replace the file (a new
        inode), so any other writer's change shows as another identity."""
        self._renderer = Renderer()

    @classmethod
    def for_project(
        cls, project_dir: str | Path, *, secret_guard: SecretGuard | None = None
    ) -> LocalBackend:
        """The default state of a project: `<project_dir>/.dstack/state.json`."""
        return cls(Path(project_dir) / DEFAULT_STATE_PATH, secret_guard=secret_guard)

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def locator(self) -> str:
        return str(self.path.resolve())

    # --- state ---------------------------------------------------------------------------

    def _load(self) -> State | None:
        """The state: the state file with the journal's lines that continue it."""
        base = self._load_file()
        if base is None:
            return None
        return self._replay_journal(base).replayed.state

    def _replay_journal(self, base: State) -> _Journaled:
        """The journal read on top of `base` (the state file as `_parsed` holds it), reading
        only what was appended since the last read when the files are the ones read then."""
        assert self._parsed is not None
        identity = self._parsed[0]
        try:
            with self.journal_path.open("rb") as f:
                st = os.fstat(f.fileno())
                inode = (st.st_dev, st.st_ino)
                known = self._journaled
                # read on only in a journal that continues this base: one of lines a fold
                # took in already (read between the fold's rename and its unlink) is about
                # to go, and the next journal may get its inode number back
                if (
                    known is not None
                    and (known.base, known.journal) == (identity, inode)
                    and known.replayed.applied > 0
                    and known.replayed.valid_end == known.size <= st.st_size
                ):
                    if known.size == st.st_size:
                        return known
                    f.seek(known.size)
                    more = replay(known.replayed.state, f.read())
                    replayed = Replayed(
                        state=more.state,
                        valid_end=known.size + more.valid_end,
                        applied=known.replayed.applied + more.applied,
                    )
                    size = known.size + (st.st_size - known.size)
                else:
                    data = f.read()
                    replayed, size = replay(base, data), len(data)
        except FileNotFoundError:
            replayed, inode, size = Replayed(state=base, valid_end=0, applied=0), (0, 0), 0
        except OSError as err:
            raise StateError(f"{self.journal_path}: cannot read: {err.strerror}") from None
        self._journaled = _Journaled(base=identity, journal=inode, size=size, replayed=replayed)
        return self._journaled

    def _load_file(self) -> State | None:
        try:
            with self.path.open("rb") as f:
                identity = _identity(os.fstat(f.fileno()))
                parsed = self._parsed
                if parsed is not None and parsed[0] == identity:
                    return parsed[1]
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StateError(f"{self.path}: cannot read state: {err.strerror}") from None
        try:
            state = parse_state(data, self.path)
        except StateError as err:
            hint = self._backup_hint()
            if hint is None:
                raise
            raise StateError(f"{err}\n{hint}") from None
        self._parsed = (identity, state)
        return state

    def _backup_hint(self) -> str | None:
        """What the backup offers when the state cannot be used: where the previous version
        is, or why it cannot help either (unreadable, corrupt); None when there is none."""
        try:
            data = self.backup_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"The backup {self.backup_path} cannot be read either: {err.strerror}."
        try:
            parse_state(data, self.backup_path)
        except StateError as err:
            reason = str(err).removeprefix(f"{self.backup_path}: ")
            return f"The backup {self.backup_path} cannot be used either: {reason}"
        return f"The previous version is in {self.backup_path}."

    @staticmethod
    def _version(state: State | None) -> str:
        return ABSENT if state is None else str(state.serial)

    def read(self) -> StateSnapshot:
        state = self._load()
        return StateSnapshot(state if state is not None else State.empty(), self._version(state))

    def write(self, new_state: State, expected: str) -> StateSnapshot:
        with self._write_lock():
            current = self._load()
            version = self._version(current)
            if version != expected:
                raise StateConflictError(
                    f"{self.path}: state changed since it was read:"
                    f" serial {version}, expected {expected}",
                    current=version,
                    expected=expected,
                )
            to_write = prepare_write(current, new_state, self.location)
            if to_write is None:
                self.secret_guard.check(new_state)
                if current is None:  # nothing stored and nothing to store
                    return StateSnapshot(new_state.model_copy(update={"serial": 0}), ABSENT)
                return StateSnapshot(current, version)
            try:
                if current is None or not self._append(current, to_write):
                    self.secret_guard.check(to_write)
                    self._replace(to_write, keep_backup=current is not None)
                    self._journaled = None
                    self.journal_path.unlink(missing_ok=True)  # folded in
            except OSError as err:  # disk full, permissions: the old state is still intact
                raise StateError(f"{self.path}: cannot write state: {err}") from None
        return StateSnapshot(to_write, self._version(to_write))

    def compact(self) -> None:
        """Fold the journal into the state file once it holds an eighth of the file (and 64
        KiB), or once it has deleted at least half the file's resources: every reader (each
        plan, each watch tick) would otherwise parse it line by line on top of the file, or
        parse the file's dead entries (after a destroy of 10,000 runs, 17 MB of them, a few
        hundred KiB of journal). A failure leaves the journal, which is as good, to the next
        commit."""
        with self._write_lock():
            try:
                size = self.journal_path.stat().st_size
                file_size = self.path.stat().st_size
            except OSError:  # no journal (or none to see): nothing to fold
                return
            grown = size >= COMPACT_FROM_BYTES and size * COMPACT_FRACTION >= file_size
            if not grown and not self._mostly_deleted():
                return
            current = self._load()
            if current is None:
                return
            try:
                self._replace(current, keep_backup=True)
                self._journaled = None
                self.journal_path.unlink(missing_ok=True)  # folded in
            except OSError as err:
                log.warning("%s: the journal stays unfolded: %s", self.path, err)

    def _mostly_deleted(self) -> bool:
        """Whether the state this backend last read or wrote holds at most half the
        resources of the state file under its journal (known without reading anything)."""
        journaled, parsed = self._journaled, self._parsed
        if journaled is None or parsed is None or journaled.base != parsed[0]:
            return False
        left = len(journaled.replayed.state.resources)
        return left * 2 <= len(parsed[1].resources)

    def _append(self, current: State, to_write: State) -> bool:
        """Commit `to_write` as a journal line when the state is large and the journal still
        smaller than the state file; False when it is to be written whole instead (which
        folds the journal in). Holds the write lock; `current` was just loaded."""
        journaled, parsed = self._journaled, self._parsed
        if journaled is None or parsed is None or importing.active():
            return False  # an import (push, migrate) is written whole, as it came
        file_size = parsed[0][2]
        if file_size < journal_from_bytes() or to_write.lineage != current.lineage:
            return False
        record = change_of(current, to_write)
        line = encode(record)
        # lines that do not count are cut off first: a torn tail, or (when none continues
        # the state file) lines a fold took in already
        keep = journaled.replayed.valid_end if journaled.replayed.applied else 0
        if keep + len(line) > file_size:
            return False  # the journal has grown as large as the file: fold it in
        self.secret_guard.check_entries(record.put)
        inode, keep = self._append_line(line, keep, journaled.journal)
        applied = (journaled.replayed.applied if keep else 0) + 1
        self._journaled = _Journaled(
            base=journaled.base,
            journal=inode,
            size=keep + len(line),
            replayed=Replayed(state=to_write, valid_end=keep + len(line), applied=applied),
        )
        return True

    def _append_line(
        self, line: bytes, keep: int, replayed: tuple[int, int]
    ) -> tuple[tuple[int, int], int]:
        """Append `line` durably to the journal cut to its first `keep` bytes (`replayed`:
        the journal file those bytes were read from); the journal's device and inode, and
        the bytes kept before the line.

        A journal file only ever grows: a cut makes a new file (renamed over the old), so a
        reader that read a journal up to some byte may read on from there while its inode
        is the same."""
        fd = os.open(
            self.journal_path,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            PRIVATE_MODE,
        )
        try:
            st = os.fstat(fd)
            inode = (st.st_dev, st.st_ino)
            if inode != replayed:
                keep = 0  # not the file read (none was): nothing in it counts
            if st.st_size == keep:
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError:  # disk full: the commit fails, so no reader may see it
                    os.ftruncate(fd, keep)
                    raise
        finally:
            os.close(fd)
        if st.st_size != keep:  # rare: after a torn append, or a fold killed midway
            kept = self.journal_path.read_bytes()[:keep]
            write_private_atomic(self.journal_path, kept + line)
            st = os.stat(self.journal_path)
            inode = (st.st_dev, st.st_ino)
        elif inode != replayed:
            fsync_dir(self.path.parent)  # a new journal: its name is durable too
        return inode, keep

    def _replace(self, state: State, *, keep_backup: bool) -> None:
        for leftover in leftover_temp_files(self.path) + leftover_temp_files(self.backup_path):
            # Only writers hold the write lock, so these belong to dead processes.
            leftover.unlink(missing_ok=True)
        if keep_backup:
            self._keep_backup()
        write_private_atomic(self.path, self._renderer.render(state))
        self._parsed = (_identity(self.path.stat()), state)
        local_history.keep(self.path, self.history_dir, state.serial)

    def _ensure_dir(self) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise StateError(f"{self.path.parent}: cannot create directory: {err}") from None

    @staticmethod
    def _open_private(path: Path) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
        except OSError as err:
            raise StateError(f"{path}: cannot open lock file: {err.strerror}") from None

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold the write lock (flock on `state.json.lock`) across a read-mutate-write."""
        return self._write_lock()

    @contextmanager
    def _write_lock(self) -> Iterator[None]:
        # Re-entrant per thread: `write` inside `exclusive` must not flock a second open
        # file of the same lock, which would wait on itself forever.
        if getattr(self._thread, "holds_write_lock", False):
            yield
            return
        self._ensure_dir()
        # Never deleted: unlinking a lock file others may have open would let two writers
        # lock two different files.
        fd = self._open_private(self.write_lock_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read, a pure mutation and a rename
            self._thread.holds_write_lock = True
            try:
                yield
            finally:
                self._thread.holds_write_lock = False
        finally:
            os.close(fd)

    def _keep_backup(self) -> None:
        # A hard link keeps the old inode (already durable, already 0600) under the backup
        # name; the atomic write then gives the state path a new inode. No copy needed.
        tmp = temp_path_for(self.backup_path)
        try:
            os.link(self.path, tmp)
        except OSError:  # a filesystem without hard links: copy instead
            write_private_atomic(self.backup_path, self.path.read_bytes(), sync_dir=False)
            return
        try:
            os.replace(tmp, self.backup_path)
        finally:
            # rename() is a no-op when both names already link the same inode (a writer
            # killed between backup and write leaves state and backup as one file): then
            # the temp name survives it and must go.
            tmp.unlink(missing_ok=True)
        if self.backup_path.stat().st_mode & 0o777 != PRIVATE_MODE:
            os.chmod(self.backup_path, PRIVATE_MODE)

    # --- earlier versions (see state/local_history.py) --------------------------------------

    def history(self) -> list[StateVersion]:
        current = self._load()
        return local_history.versions(self.history_dir, current, self.path)

    def read_version(self, version_id: str) -> State:
        current = self._load()
        if current is not None and version_id == str(current.serial):
            return current
        return local_history.read(self.history_dir, version_id, self.location)

    # --- records beside the state (see state/local_records.py) ----------------------------

    def record_path(self, name: str) -> Path:
        """The file of record `name`: `.dstack/events.jsonl` beside `.dstack/state.json`."""
        return local_records.record_path(self.path, name)

    def read_record(self, name: str) -> RecordSnapshot:
        return local_records.read_record(self.record_path(name))

    def write_record(self, name: str, data: bytes | None, expected: str) -> str:
        return local_records.write_record(self.record_path(name), data, expected)

    def append_lines(
        self, name: str, lines: list[bytes], *, keep_last: int, trim_past: int
    ) -> None:
        local_records.append_lines(
            self.record_path(name), lines, keep_last=keep_last, trim_past=trim_past
        )

    # --- operation lock ------------------------------------------------------------------

    def try_lock(self, operation: str, who: str, ttl: float, clock: Clock) -> LocalLockHandle:
        self._ensure_dir()
        for _ in range(_MAX_LOCK_FILE_RACES):
            fd = self._open_private(self.lock_info_path)
            try:
                # A second try covers a `read_lock_info` probe holding a shared lock briefly.
                if not _try_flock(fd, fcntl.LOCK_EX) and not _try_flock(fd, fcntl.LOCK_EX):
                    holder = _holder_record(fd)
                    raise lock_held_error(self.location, holder, clock.now(), local=True)
                if not _is_current(fd, self.lock_info_path):
                    os.close(fd)  # the holder released and unlinked it: open the new one
                    continue
                info = LockInfo.new(
                    operation=operation,
                    who=who,
                    path=str(self.path),
                    ttl=ttl,
                    clock=clock,
                    pid=os.getpid(),
                )
                os.fchmod(fd, PRIVATE_MODE)
                _write_lock_record(fd, info)
            except BaseException:
                os.close(fd)
                raise
            return LocalLockHandle(fd, self.lock_info_path, info, ttl=ttl, clock=clock)
        raise StateError(f"{self.lock_info_path}: lock file keeps being replaced; try again")

    def unlock(self, lock_id: str) -> None:
        """Remove a lock record left by a process that is gone, if its id is `lock_id`.

        A live holder cannot be unlocked from outside: its flock belongs to its process.
        """
        try:
            fd = os.open(self.lock_info_path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise LockError(f"{self.location} is not locked", None) from None
        try:
            holder = _read_lock_record(fd)
            if not _try_flock(fd, fcntl.LOCK_EX):
                pid = f" (pid {holder.pid})" if holder and holder.pid else ""
                raise LockError(
                    f"cannot force-unlock {self.location}: the lock is held by a running"
                    f" process{pid}. A local lock is released when its process exits;"
                    f" stop that process instead.\n" + (holder.describe() if holder else ""),
                    holder,
                )
            if holder is not None and holder.id != lock_id:
                raise LockError(
                    f"lock id {lock_id} does not match the lock on {self.location} ({holder.id})",
                    holder,
                )
            if _is_current(fd, self.lock_info_path):
                self.lock_info_path.unlink()
        finally:
            os.close(fd)

    def read_lock_info(self) -> LockInfo | None:
        try:
            fd = os.open(self.lock_info_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            if _try_flock(fd, fcntl.LOCK_SH):
                return None  # a record nobody holds: left by a process that was killed
            return _read_lock_record(fd)
        finally:
            os.close(fd)
