"""The `local` backend's records: files beside the state file, each with its own flock.

Record `events.jsonl` of `.dstack/state.json` is `.dstack/events.jsonl`; of a state file with
another name (`prod.json`) it is `prod.events.jsonl`, so two states in one directory keep
separate records. `<record>.lock` beside it is flocked for each write (never deleted, like
`state.json.lock`); reads take no lock: a replace is an atomic rename, and an append is read
up to its last complete line.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dstack_plan.config.atomic import PRIVATE_MODE, write_private_atomic
from dstack_plan.errors import StateError
from dstack_plan.state.backend import ABSENT, StateConflictError
from dstack_plan.state.records import RecordSnapshot, check_record_name, joined, trimmed


def record_path(state_path: Path, name: str) -> Path:
    """Where record `name` of the state file `state_path` lives (see the module docstring)."""
    check_record_name(name)
    if state_path.name == "state.json":
        return state_path.with_name(name)
    return state_path.with_name(f"{state_path.stem}.{name}")


def _version(data: bytes | None) -> str:
    # A content hash: two different records never share a version, and writing the same
    # bytes again leaves the record (and so its meaning) unchanged.
    return ABSENT if data is None else hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StateError(f"{path}: cannot read: {err.strerror}") from None


@contextmanager
def _flocked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
    except OSError as err:
        raise StateError(f"{lock_path}: cannot open lock file: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for one read and one write: milliseconds
        yield
    finally:
        os.close(fd)  # closing drops the flock


def read_record(path: Path) -> RecordSnapshot:
    """The record at `path` and its version."""
    data = _read(path)
    return RecordSnapshot(data, _version(data))


def write_record(path: Path, data: bytes | None, expected: str) -> str:
    """Compare-and-swap under the record's flock: replace (or delete, for None) atomically."""
    with _flocked(path):
        current = _version(_read(path))
        if current != expected:
            raise StateConflictError(
                f"{path}: changed since it was read", current=current, expected=expected
            )
        try:
            if data is None:
                path.unlink(missing_ok=True)
            else:
                write_private_atomic(path, data)
        except OSError as err:
            raise StateError(f"{path}: cannot write: {err}") from None
    return _version(data)


def append_lines(path: Path, lines: list[bytes], *, keep_last: int, trim_past: int) -> None:
    """Append `lines` under the flock; rewrite with the last `keep_last` past `trim_past`."""
    if not lines:
        return
    with _flocked(path):
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
            try:
                size = os.fstat(fd).st_size
                torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"  # a writer died mid-line
                payload = (b"\n" if torn else b"") + joined(None, lines)
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                # No fsync: events are a record of what watch saw, not state; losing the
                # last few in a power cut is acceptable, a sync on every tick is not.
            finally:
                os.close(fd)
            data = _read(path) or b""
            shorter = trimmed(data, keep_last=keep_last, trim_past=trim_past)
            if shorter is not None:
                write_private_atomic(path, shorter, sync_dir=False)
        except OSError as err:
            raise StateError(f"{path}: cannot append: {err}") from None
