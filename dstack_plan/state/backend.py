"""The backend interface every state store implements (`local` now, `s3` later).

A backend stores one state document, one operation lock and a few small records beside
them (`state/records.py`: watch's leader lease and event log). Writes are compare-and-swap on
an opaque version token taken from a previous `read()`: the serial for `local`, the ETag for
`s3`. The rules for what a write persists live in `prepare_write`, shared by all backends.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import ClassVar, Final, NamedTuple

from dstack_plan.clock import Clock, SystemClock
from dstack_plan.errors import StateError
from dstack_plan.state import importing
from dstack_plan.state.lock import (
    LockHandle,
    LockInfo,
    acquire_with_backoff,
    default_who,
    lock_lease,
)
from dstack_plan.state.model import State
from dstack_plan.state.records import RecordSnapshot, joined, trimmed

ABSENT: Final = "absent"
"""The version token of a state that has never been written."""
RECORD_CAS_ATTEMPTS: Final = 20


class StateSnapshot(NamedTuple):
    """A state as read (or just written) together with the version token to CAS against."""

    state: State
    version: str

    @property
    def exists(self) -> bool:
        """False for a state never written; its lineage is then fresh on every read."""
        return self.version != ABSENT


class StateVersion(NamedTuple):
    """One stored version of the state, for `dstack state history`."""

    id: str
    """Opaque, for `StateBackend.read_version`: a backup file's name, an S3 version id."""
    serial: int
    lineage: str
    written_at: datetime | None
    """When it was stored, when the backend knows (file mtime, S3 LastModified)."""
    current: bool = False
    """The version `read()` returns now."""


class StateConflictError(StateError):
    """Someone else wrote the state after it was read: re-read, re-apply, write again."""

    def __init__(self, message: str, *, current: str, expected: str) -> None:
        self.current = current
        self.expected = expected
        super().__init__(message)


def prepare_write(current: State | None, proposed: State, location: str) -> State | None:
    """What a backend persists when `proposed` replaces `current` (None: nothing stored yet).

    Returns None when nothing would change (identical resources, or an empty state over a
    missing one), so the write is a no-op. Otherwise returns `proposed` with
    serial = current serial + 1: backends assign serials, whatever `proposed.serial` says.
    Refuses a state of another lineage: it is unrelated history, not a newer version.
    Inside `state.importing.importing()` (push, migrate) the rules of an import apply.
    """
    if importing.active():
        return importing.prepare_import(current, proposed, location)
    if current is None:
        if not proposed.resources:
            return None
        return proposed.model_copy(update={"serial": 1})
    if proposed.lineage != current.lineage:
        raise StateError(
            f"{location}: refusing to overwrite state of lineage {current.lineage} with"
            f" unrelated state of lineage {proposed.lineage}"
        )
    if proposed.same_content(current):
        return None
    return proposed.model_copy(update={"serial": current.serial + 1})


class StateBackend(ABC):
    """One state document plus its operation lock.

    All methods but `lock` are synchronous and quick; async callers with a slow (network)
    backend wrap them in `asyncio.to_thread` (see `commit_async`).
    """

    commit_attempts: ClassVar[int] = 10
    """How often `commit` tries a read-modify-write before it gives up on conflicts."""
    commit_max_pause: ClassVar[float] = 0.25
    """The longest random pause (seconds) between two attempts; the pause grows with each."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the state lives, for messages: a path or an `s3://bucket/key` URL."""

    @property
    def locator(self) -> str:
        """What `state.select.open_backend` opens this same state from, wherever it runs:
        another project is told it (a host's claim names its owner's state)."""
        return self.location

    @abstractmethod
    def read(self) -> StateSnapshot:
        """The current state and its version; an empty state with version ABSENT if none.

        Never creates anything. Raises StateError for an unreadable or corrupt state.
        """

    def read_lineage(self) -> str | None:
        """The lineage of the stored state, or None when none is stored yet.

        Raises StateError like `read` when the state cannot be read.
        """
        snapshot = self.read()
        return snapshot.state.lineage if snapshot.exists else None

    @abstractmethod
    def write(self, new_state: State, expected: str) -> StateSnapshot:
        """Compare-and-swap: persist `new_state` if the stored version is still `expected`.

        Raises StateConflictError when someone wrote in between, StateError for another
        lineage or a secret value in the state. Identical content is a no-op that returns
        the stored snapshot without bumping the serial; otherwise the serial is set to
        stored + 1 and the returned snapshot holds what was written and its new version.
        """

    def exclusive(self) -> AbstractContextManager[None]:
        """Keep other writers out for a whole read-mutate-write (`commit` uses it).

        Optional: a backend with a cheap exclusive lock (local flock) returns it so that
        commits never conflict; others (S3) return a no-op and rely on CAS and retries.
        `read` and `write` must work inside it.
        """
        return nullcontext()

    def compact(self) -> None:
        """Make the stored state quick to read for whoever reads it next, after many small
        commits (an apply's end); the content and serial stay. Optional: most backends
        always store the state whole."""
        return None

    # --- earlier versions (`dstack state history`) -------------------------------------------

    def history(self) -> list[StateVersion]:
        """The stored versions, newest first (the current one included, marked `current`)."""
        raise StateError(f"{self.location}: this backend keeps no earlier versions")

    def read_version(self, version_id: str) -> State:
        """The state as stored in version `version_id` (an id from `history`)."""
        raise StateError(f"{self.location}: this backend keeps no earlier versions")

    # --- records beside the state (watch's leader lease and event log) ---------------------

    def read_record(self, name: str) -> RecordSnapshot:
        """The record `name` kept beside the state and its version (ABSENT when missing)."""
        raise StateError(f"{self.location}: this backend keeps no records beside the state")

    def write_record(self, name: str, data: bytes | None, expected: str) -> str:
        """Compare-and-swap: store `data` as record `name` (None deletes it) if its version
        is still `expected` (ABSENT: it must not exist). Returns the new version; raises
        StateConflictError when someone wrote it in between."""
        raise StateError(f"{self.location}: this backend keeps no records beside the state")

    def append_lines(
        self, name: str, lines: list[bytes], *, keep_last: int, trim_past: int
    ) -> None:
        """Append `lines` (no newlines inside) to the line log `name`; once it holds more
        than `trim_past` lines, only the last `keep_last` are kept.

        This default is a read-append-write retried on conflict (an object store cannot
        append); a backend that can append in place overrides it.
        """
        for attempt in range(1, RECORD_CAS_ATTEMPTS + 1):
            snapshot = self.read_record(name)
            data = joined(snapshot.data, lines)
            data = trimmed(data, keep_last=keep_last, trim_past=trim_past) or data
            try:
                self.write_record(name, data, snapshot.version)
                return
            except StateConflictError:
                # a random, growing pause, so racing writers drift apart (as `commit` does)
                time.sleep(random.uniform(0, min(0.25, 0.002 * 2**attempt)))
        raise StateError(f"{self.location}: {name} kept changing; gave up appending to it")

    @abstractmethod
    def try_lock(self, operation: str, who: str, ttl: float, clock: Clock) -> LockHandle:
        """Take the operation lock now or raise LockError carrying the holder's LockInfo."""

    @abstractmethod
    def unlock(self, lock_id: str) -> None:
        """Force-unlock: remove the lock if its id is `lock_id`; LockError otherwise."""

    @abstractmethod
    def read_lock_info(self) -> LockInfo | None:
        """The record of the current holder, or None when the state is not locked."""

    async def lock(
        self,
        operation: str,
        *,
        who: str | None = None,
        timeout: float = 0.0,
        clock: Clock | None = None,
        ttl: float | None = None,
    ) -> LockHandle:
        """Take the operation lock, retrying with backoff for up to `timeout` seconds.

        `who` defaults to user@hostname, `ttl` (the lease) to `lock_lease()`. The handle must
        be released (`release()` or `async with`); `hold_lock` also renews it while held.
        """
        clock = clock or SystemClock()
        holder = who or default_who()
        lease = lock_lease() if ttl is None else ttl
        return await acquire_with_backoff(
            lambda: self.try_lock(operation, holder, lease, clock), timeout=timeout, clock=clock
        )
