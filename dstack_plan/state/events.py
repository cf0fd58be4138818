"""The event log: status transitions `dstack watch` saw, kept beside the state, bounded.

One JSON object per line in record `events.jsonl` (`.dstack/events.jsonl` for the local
backend), appended in the order watch saw them. The last `max_events` (default 10,000) are
kept: the file is trimmed back to that many once it holds twice as many, so a rewrite happens
once per `max_events` appended. Events carry addresses, statuses and reasons only; a reason
that contains a registered secret value is stored with the value replaced by `(sensitive)`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncGenerator, Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.clock import Clock
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.records import complete_lines
from dstack_plan.state.secrets import SecretGuard

logger = logging.getLogger(__name__)

EVENTS_RECORD = "events.jsonl"
DEFAULT_MAX_EVENTS = 10_000
MAX_REASON_LENGTH = 500
"""Longer reasons (a job's termination message, say) are cut: each event stays one short line."""
REDACTED = "(sensitive)"

EventKind = Literal["run", "job", "host", "fleet", "gpu"]

FAILED_STATUSES = frozenset({"failed"})
WARNING_STATUSES = frozenset({"terminating", "terminated", "aborted", "unreachable"})
LIMIT_REASONS = (
    "max_duration_exceeded",
    "inactivity_duration_exceeded",
    "terminated_due_to_utilization_policy",
    "retry_limit_exceeded",
    "instance_unreachable",
)


def span_id(address: str, generation: int | float | str | datetime) -> str:
    """The id shared by every event of one run object: its address and its generation (or
    created_at), so a run replaced under the same address starts a new span."""
    if isinstance(generation, datetime):
        generation = generation.isoformat()
    return f"{address}@{generation}"


class Event(BaseModel):
    """One status transition of a run, job, host or fleet."""

    # Events are only displayed and filtered, so fields a newer version writes must not make
    # an older one unable to read the log.
    model_config = ConfigDict(extra="ignore", frozen=True)

    time: float
    """Epoch seconds (the watch's clock)."""
    address: str
    """The resource address (`task.train`, `fleet.onprem`)."""
    kind: EventKind
    span_id: str
    """One per run object (see `span_id`), so the events of one lifetime group together."""
    old_status: str | None = None
    """None for an object seen for the first time."""
    new_status: str
    job_id: str | None = None
    reason: str | None = None
    host: str | None = None
    """The machine a job event's job ran on, or a host event's host, when known."""


def event_level(event: Event) -> str:
    """How serious `event` is, as a log level: `error` for a move to failed, `warning` for a
    move to terminated (or terminating, aborted, unreachable) or a limit crossed, else
    `info`."""
    if event.new_status in FAILED_STATUSES:
        return "error"
    reason = (event.reason or "").lower()
    if event.new_status in WARNING_STATUSES or any(r in reason for r in LIMIT_REASONS):
        return "warning"
    return "info"


def event_message(event: Event) -> str:
    """`old -> new: reason` (`- -> new` for an object seen for the first time)."""
    text = f"{event.old_status or '-'} -> {event.new_status}"
    return f"{text}: {event.reason}" if event.reason else text


class EventLog:
    """The bounded event log of one state backend."""

    def __init__(
        self,
        backend: StateBackend,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        secret_guard: SecretGuard | None = None,
    ) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.backend = backend
        self.max_events = max_events
        self.secret_guard = secret_guard

    def append(self, events: Iterable[Event]) -> None:
        """Add events at the end of the log (in the order given), dropping the oldest past
        the bound. Reasons are cut to MAX_REASON_LENGTH and cleared of secret values."""
        lines = [self._clean(e).model_dump_json().encode("utf-8") for e in events]
        if lines:
            self.backend.append_lines(
                EVENTS_RECORD, lines, keep_last=self.max_events, trim_past=2 * self.max_events
            )

    def _clean(self, event: Event) -> Event:
        reason = event.reason
        if reason is None:
            return event
        if self.secret_guard is not None:
            reason = self.secret_guard.redact(reason, REDACTED)
        if len(reason) > MAX_REASON_LENGTH:
            reason = reason[: MAX_REASON_LENGTH - 3] + "..."
        return event if reason == event.reason else event.model_copy(update={"reason": reason})

    def read(self, since: float | None = None, address: str | None = None) -> list[Event]:
        """The retained events in log order: those at or after `since` (epoch seconds) and of
        `address`, when given. Lines that cannot be read are skipped."""
        events = []
        for line in complete_lines(self.backend.read_record(EVENTS_RECORD).data)[
            -self.max_events :
        ]:
            try:
                event = Event.model_validate_json(line)
            except (ValidationError, ValueError):
                logger.warning("skipping an unreadable line of the event log")
                continue
            if (since is None or event.time >= since) and (
                address is None or event.address == address
            ):
                events.append(event)
        return events

    async def follow(
        self,
        since: float | None,
        clock: Clock,
        poll: float = 0.5,
        address: str | None = None,
    ) -> AsyncGenerator[Event, None]:
        """The events `read(since, address)` gives, then each new one as it is appended,
        checking every `poll` seconds; runs until cancelled (see `follow_batches`)."""
        async for batch in self.follow_batches(since, clock, poll, address):
            for event in batch:
                yield event

    async def follow_batches(
        self,
        since: float | None,
        clock: Clock,
        poll: float = 0.5,
        address: str | None = None,
    ) -> AsyncGenerator[list[Event], None]:
        """What `read(since, address)` gives now (possibly empty), then each poll's new
        events (only when there are some); runs until cancelled.

        New events are found by time: those after the last one yielded, and those at the
        same time beyond the ones already yielded. Watch appends in time order, so none is
        missed; one appended with an older time than the last yielded is not shown.
        """
        cursor = EventCursor(since)
        first = True
        while True:
            fresh = cursor.take(await asyncio.to_thread(self.read, since, address))
            if fresh or first:
                yield fresh
            first = False
            await clock.sleep(poll)


class EventCursor:
    """Where a reader of the log is: which events of a later read it has not seen yet."""

    def __init__(self, since: float | None = None) -> None:
        self._after = -math.inf if since is None else since
        self._seen_at_after = 0  # events at exactly `_after` already taken

    def take(self, events: list[Event]) -> list[Event]:
        """The events of `events` (a read of the log, in log order) not taken before."""
        fresh = []
        same = 0
        for event in events:
            if event.time > self._after:
                fresh.append(event)
            elif event.time == self._after:
                same += 1
                if same > self._seen_at_after:
                    fresh.append(event)
        if fresh:
            self._after = fresh[-1].time
            self._seen_at_after = sum(1 for e in events if e.time == self._after)
        return fresh
