"""The leader lease: which one of several `dstack watch` processes may act on the state.

Every watch process observes; only the holder of an unexpired lease acts (resubmits, stops,
scales). The lease is a small record beside the state (`watch-lease.json` for the local
backend), written with compare-and-swap, so two holders never both believe they lead at the
same moment: a holder that gets True leads until `now + ttl` (its clock, read before the
write), and nobody else can take the record before that time has passed. An expired lease
may be taken by anyone. It is not the operation lock: `apply` and `watch` run side by side.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.clock import Clock, SystemClock
from dstack_plan.state.backend import StateBackend, StateConflictError
from dstack_plan.state.liveness import pid_space, process_gone

logger = logging.getLogger(__name__)

LEASE_RECORD = "watch-lease.json"
DEFAULT_LEASE_TTL = 15.0
"""Seconds a lease lasts without renewal; watch renews it every tick."""


def new_holder_id() -> str:
    """A holder id unique to this process and call: `host:pid:random`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseRecord(BaseModel):
    """Who leads, since when, and until when unless renewed (epoch seconds)."""

    # Fields a newer version adds must not stop an older one from reading who leads.
    model_config = ConfigDict(extra="ignore", frozen=True)

    holder: str
    host: str
    pid: int
    acquired_at: float
    renewed_at: float
    expires_at: float
    pid_space: str | None = None
    """Which process-id space `pid` is in (this boot of this machine, this PID namespace):
    only a process in the same one may judge from `pid` that the holder died."""

    def is_expired(self, now: float) -> bool:
        """True once `now` has reached `expires_at`: anyone may take the lease."""
        return now >= self.expires_at

    def to_bytes(self) -> bytes:
        """The stored form (JSON)."""
        return self.model_dump_json().encode("utf-8")


def _holder_died(record: LeaseRecord) -> bool:
    """The holder ran in this PID space and its process is gone (killed, crashed): a watch
    started again here need not wait out the lease of the one it replaces."""
    return process_gone(record.pid, record.pid_space, None)


def parse_lease(data: bytes | None) -> LeaseRecord | None:
    """The record in `data`; None when there is none or it is unreadable (anyone may take it)."""
    if data is None:
        return None
    try:
        return LeaseRecord.model_validate_json(data)
    except (ValidationError, ValueError):
        logger.warning("ignoring an unreadable leader lease record")
        return None


class LeaderLease:
    """The lease as held (or wanted) by `holder_id`. Not thread-safe: one per watch loop.

    Its methods are synchronous backend calls (quick on the local backend); an async caller
    with a network backend runs them in `asyncio.to_thread`.
    """

    def __init__(
        self,
        backend: StateBackend,
        holder_id: str,
        ttl: float = DEFAULT_LEASE_TTL,
        clock: Clock | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.backend = backend
        self.holder_id = holder_id
        self.ttl = ttl
        self.clock: Clock = clock or SystemClock()
        self._valid_until: float | None = None

    @property
    def valid_until(self) -> float | None:
        """Until when this holder leads (epoch seconds) after its last successful
        `acquire_or_renew`; None when it does not lead."""
        return self._valid_until

    def is_leader(self) -> bool:
        """True while the lease this holder last got is unexpired by its clock."""
        return self._valid_until is not None and self.clock.now() < self._valid_until

    def acquire_or_renew(self) -> bool:
        """Take the lease (absent, expired, or already ours) or renew it; True if we lead.

        True means this holder leads until `now + ttl`. False when another holder has an
        unexpired lease, or wrote the record between our read and our write.
        """
        now = self.clock.now()
        snapshot = self.backend.read_record(LEASE_RECORD)
        current = parse_lease(snapshot.data)
        if (
            current is not None
            and current.holder != self.holder_id
            and not current.is_expired(now)
            and not _holder_died(current)
        ):
            self._valid_until = None
            return False
        # a lease of ours that lapsed starts a new term (nobody led in between either)
        term_start = now
        if current is not None and current.holder == self.holder_id:
            if not current.is_expired(now):
                term_start = current.acquired_at
        record = LeaseRecord(
            holder=self.holder_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            acquired_at=term_start,
            renewed_at=now,
            expires_at=now + self.ttl,
            pid_space=pid_space(),
        )
        try:
            self.backend.write_record(LEASE_RECORD, record.to_bytes(), snapshot.version)
        except StateConflictError:
            self._valid_until = None  # someone wrote first; they lead, or the next tick sees
            return False
        self._valid_until = record.expires_at
        return True

    def release(self) -> None:
        """Give the lease up now (when stopping), so another watch need not wait for ttl.

        Does nothing when someone else holds it.
        """
        self._valid_until = None
        snapshot = self.backend.read_record(LEASE_RECORD)
        current = parse_lease(snapshot.data)
        if current is None or current.holder != self.holder_id:
            return
        try:
            self.backend.write_record(LEASE_RECORD, None, snapshot.version)
        except StateConflictError:
            pass  # it changed hands meanwhile: no longer ours to remove

    def current(self) -> LeaseRecord | None:
        """Who leads now: the stored record while unexpired, else None."""
        return leader(self.backend, self.clock.now())


def leader(backend: StateBackend, now: float) -> LeaseRecord | None:
    """The watch that leads on `backend` at `now`: its record while unexpired and its
    process is not known to be gone; None when no watch leads."""
    record = parse_lease(backend.read_record(LEASE_RECORD).data)
    if record is None or record.is_expired(now) or _holder_died(record):
        return None
    return record
