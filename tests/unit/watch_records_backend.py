"""A backend with records and nothing else: compare-and-swap only, no append, no flock.

It stands for an object store (S3 comes later): the lease and the event log must work on
the base-class behaviour that such a backend gets.
"""

from __future__ import annotations

import hashlib
import threading

from dstack_plan.clock import Clock
from dstack_plan.state.backend import ABSENT, StateBackend, StateConflictError, StateSnapshot
from dstack_plan.state.lock import LockHandle, LockInfo
from dstack_plan.state.model import State
from dstack_plan.state.records import RecordSnapshot, check_record_name


class DictRecordsBackend(StateBackend):
    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}
        self.writes = 0
        self._mutex = threading.Lock()  # the object store's own atomicity

    @property
    def location(self) -> str:
        return "memory://records"

    @staticmethod
    def _etag(data: bytes | None) -> str:
        return ABSENT if data is None else hashlib.md5(data).hexdigest()

    def read_record(self, name: str) -> RecordSnapshot:
        data = self.records.get(check_record_name(name))
        return RecordSnapshot(data, self._etag(data))

    def write_record(self, name: str, data: bytes | None, expected: str) -> str:
        with self._mutex:
            current = self._etag(self.records.get(check_record_name(name)))
            if current != expected:
                raise StateConflictError("changed", current=current, expected=expected)
            if data is None:
                self.records.pop(name, None)
            else:
                self.records[name] = data
            self.writes += 1
            return self._etag(data)

    def read(self) -> StateSnapshot:
        return StateSnapshot(State.empty(), ABSENT)

    def write(self, new_state: State, expected: str) -> StateSnapshot:
        raise NotImplementedError

    def try_lock(self, operation: str, who: str, ttl: float, clock: Clock) -> LockHandle:
        raise NotImplementedError

    def unlock(self, lock_id: str) -> None:
        raise NotImplementedError

    def read_lock_info(self) -> LockInfo | None:
        return None
