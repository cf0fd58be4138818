"""`dstack logs --json`: a job's output lines and its run's events, merged in time order.

Every line is one JSON object with the keys of `agent/logformat.KEYS` (those of `--log-format
json`): job output is `event: job_output`, `level: info`, `resource_type: job`, `ts` from the
agent's time index; each event of the run's event log is `event: status_changed`, at the level
`state/events.event_level` gives, `resource_type` its kind, `message` `old -> new: reason`.
Output lines carry the span id of the run's current lifetime; events their own (the same one
unless the run was replaced under its address). On equal times output comes first: watch
records a status after the output that led to it.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from dstack_plan.agent.logformat import log_line, rfc3339
from dstack_plan.inspect.logs import finished_before, open_job, select_job
from dstack_plan.inspect.runs import find_run
from dstack_plan.runs.records import run_span_id
from dstack_plan.state.events import (
    Event,
    EventCursor,
    EventLog,
    event_level,
    event_message,
)

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import LogChunk
    from dstack_plan.project import Project

JOB_OUTPUT = "job_output"
FOLLOW_WAIT = 2
"""Seconds one long poll of a followed log waits for output before events are looked at."""
EVENTS_LOGGER = "dstack_plan.watch.events"
"""The `logger` of event lines: the one `dstack watch` logs the same events with."""


class TimedLines:
    """Splits a job's log chunks into lines, each dated by the chunks' time index."""

    def __init__(self) -> None:
        self._buffer = b""
        self._start = 0  # offset of the buffer's first byte
        self._offsets: list[int] = []
        self._times: list[float] = []

    def feed(self, chunk: LogChunk) -> list[tuple[float | None, str]]:
        """The complete lines `chunk` ends, as (epoch or None when unknown, text)."""
        lines = []
        if chunk.offset != self._start + len(self._buffer):
            lines = self.flush()  # a gap (rotation): what was cut is a line of its own
            self._start = chunk.offset
        for offset, at in chunk.times:
            if not self._offsets or offset > self._offsets[-1]:
                self._offsets.append(offset)
                self._times.append(at)
        self._buffer += chunk.data
        while (end := self._buffer.find(b"\n")) >= 0:
            lines.append((self._time_of(self._start), _text(self._buffer[:end])))
            self._buffer = self._buffer[end + 1 :]
            self._start += end + 1
        # Only the pair dating the buffer's start is needed from here on.
        keep = max(0, bisect.bisect_right(self._offsets, self._start) - 1)
        del self._offsets[:keep], self._times[:keep]
        return lines

    @property
    def line_end(self) -> int:
        """The log offset just past the last complete line returned: where to read again
        from to get the next line whole."""
        return self._start

    def flush(self) -> list[tuple[float | None, str]]:
        """The last line when the log did not end with a newline."""
        if not self._buffer:
            return []
        line = (self._time_of(self._start), _text(self._buffer))
        self._start += len(self._buffer)
        self._buffer = b""
        return [line]

    def _time_of(self, offset: int) -> float | None:
        i = bisect.bisect_right(self._offsets, offset)
        return self._times[i - 1] if i else None


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").rstrip("\r")


def event_entry(event: Event) -> dict[str, object]:
    """The `--json` object of one event of the event log."""
    return log_line(
        ts=rfc3339(event.time),
        level=event_level(event),
        event="status_changed",
        address=event.address,
        job_id=event.job_id,
        host=event.host,
        resource_type=event.kind,
        span_id=event.span_id,
        message=event_message(event),
        logger=EVENTS_LOGGER,
    )


class Merger:
    """Writes output lines and events to `out` as JSON lines, in time order."""

    def __init__(
        self, out: TextIO, output_entry: Callable[[float | None, str], dict[str, object]]
    ):
        self.out = out
        self.output_entry = output_entry
        self.pending: list[Event] = []  # events not written yet, in time order

    def add_events(self, events: list[Event]) -> None:
        """Events to write once output reaches their time (or `drain` is called)."""
        self.pending = sorted([*self.pending, *events], key=lambda e: e.time)

    def lines(self, lines: list[tuple[float | None, str]]) -> None:
        """Write output lines, each after the events older than it."""
        for at, text in lines:
            if at is not None:
                older = [e for e in self.pending if e.time < at]
                self._write_events(older)
                self.pending = self.pending[len(older) :]
            self._write(self.output_entry(at, text))

    def drain(self) -> None:
        """Write every pending event."""
        self._write_events(self.pending)
        self.pending = []

    def _write_events(self, events: list[Event]) -> None:
        for event in events:
            self._write(event_entry(event))

    def _write(self, entry: dict[str, object]) -> None:
        self.out.write(json.dumps(entry, ensure_ascii=False) + "\n")


async def write_json_logs(
    project: Project,
    ref: str,
    out: TextIO,
    *,
    replica: int = 0,
    job: int = 0,
    follow: bool = False,
    since: float | None = None,
    attempt: int | None = None,
) -> None:
    """Write one job's output of run `ref` (of its attempt `attempt`, default the latest)
    and the run's events (of all its attempts) as JSON lines to `out` (see the module
    docstring); with `follow`, until the job ends; with `since`, only what happened from
    then on."""
    run = find_run(project.backend.read().state, ref)
    record = select_job(run, replica, job, attempt)
    span = run_span_id(run)

    def output_entry(at: float | None, text: str) -> dict[str, object]:
        return log_line(
            ts=None if at is None else rfc3339(at),
            level="info",
            event=JOB_OUTPUT,
            address=run.address,
            job_id=record.id,
            host=record.host,
            resource_type="job",
            span_id=span,
            message=text,
            logger=None,
        )

    events = EventLog(project.backend)
    cursor = EventCursor(since)
    merger = Merger(out, output_entry)
    merger.add_events(cursor.take(events.read(since, run.address)))
    agent, info = await open_job(project, run, record)
    splitter = TimedLines()
    offset = 0
    first = True
    while not finished_before(info, since):
        wait = FOLLOW_WAIT if follow else 0
        chunk = await agent.logs(record.id, offset, wait=wait, since=since if first else None)
        first = False
        merger.lines(splitter.feed(chunk))
        offset = chunk.next_offset
        if follow:
            fresh = await asyncio.to_thread(events.read, since, run.address)
            merger.add_events(cursor.take(fresh))
            if chunk.complete:
                break
            if not chunk.data:
                merger.drain()  # quiet output: what watch saw meanwhile need not wait
            out.flush()
        elif not chunk.data or offset >= (chunk.size or 0):
            break
    merger.lines(splitter.flush())
    merger.drain()
    out.flush()
