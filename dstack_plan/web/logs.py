"""A job's output for the API: its retained lines, or followed as server-sent events.

Following sends one `event: line` per output line (`data:` a `LogLine` as JSON), a comment
(`: waiting`) while the job is quiet, so a client that went away is noticed, and a last
`event: end` (`data:` a `LogEnd`) when the job has ended and all its output was sent, or
`event: error` (`data:` an `ApiError`) when its agent stopped answering meanwhile. The last
line of each batch carries an `id:`, the log offset past it, so a client that reconnects
with `Last-Event-ID` (browsers do by themselves) goes on from the next line.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from dstack_plan.errors import AgentError, DstackPlanError, ProviderError
from dstack_plan.inspect.json_logs import FOLLOW_WAIT, TimedLines
from dstack_plan.inspect.logs import open_job, select_job
from dstack_plan.runs.attempts import current_attempt
from dstack_plan.web.models import JobLogs, LogEnd, LogLine
from dstack_plan.web.source import ApiSource, NotFound

if TYPE_CHECKING:
    from dstack_plan.agent.jobs_api import JobsAPI
    from dstack_plan.runs.records import JobRecord
    from dstack_plan.state.model import ResourceState

MAX_LINES = 10_000
"""The last lines `/logs` answers with, at most (follow streams everything)."""
QUIET = b": waiting\n\n"


async def job_logs(
    source: ApiSource, ref: str, replica: int = 0, job: int = 0, attempt: int | None = None
) -> JobLogs:
    """The retained output of job (`replica`, `job`) of run `ref`, of its attempt `attempt`
    (None: the latest), the last MAX_LINES lines."""
    run, record, agent = await _open(source, ref, replica, job, attempt)
    info = await agent.get_job(record.id)
    lines: deque[LogLine] = deque(maxlen=MAX_LINES)
    splitter = TimedLines()
    offset = 0
    while True:
        chunk = await agent.logs(record.id, offset)
        lines.extend(_lines(source, splitter.feed(chunk)))
        if not chunk.data or chunk.next_offset >= (chunk.size or 0):
            break
        offset = chunk.next_offset
    lines.extend(_lines(source, splitter.flush()))
    return JobLogs(
        address=run.address,
        job_id=record.id,
        host=record.host,
        status=info.status.value,
        lines=tuple(lines),
        attempt=current_attempt(run.attributes) if attempt is None else attempt,
    )


async def follow(
    source: ApiSource,
    ref: str,
    replica: int = 0,
    job: int = 0,
    start: int = 0,
    attempt: int | None = None,
) -> SseStream:
    """The stream of job (`replica`, `job`) of run `ref` (of its attempt `attempt`, None: the
    latest) from log offset `start` (a `Last-Event-ID`); opened (or NotFound) before the
    response starts, so a wrong name is a 404, not an empty stream."""
    _, record, agent = await _open(source, ref, replica, job, attempt)
    return SseStream(source, agent, record.id, start)


class SseStream:
    """The server-sent events of one followed job log."""

    def __init__(self, source: ApiSource, agent: JobsAPI, job_id: str, start: int) -> None:
        self.source, self.agent, self.job_id, self.start = source, agent, job_id, start

    async def frames(self) -> AsyncIterator[bytes]:
        splitter = TimedLines()
        offset = self.start
        while True:
            chunk = await self.agent.logs(self.job_id, offset, wait=FOLLOW_WAIT)
            offset = chunk.next_offset
            found = _lines(self.source, splitter.feed(chunk))
            for number, line in enumerate(found, 1):
                last = number == len(found)
                yield frame("line", line.model_dump_json(), splitter.line_end if last else None)
            if chunk.complete:
                break
            if not chunk.data:
                yield QUIET
        for line in _lines(self.source, splitter.flush()):
            yield frame("line", line.model_dump_json())
        info = await self.agent.get_job(self.job_id)
        end = LogEnd(job_id=self.job_id, status=info.status.value, exit_code=info.exit_code)
        yield frame("end", end.model_dump_json())


def frame(event: str, data: str, event_id: int | None = None) -> bytes:
    """One server-sent event (`data` holds no newline: it is one line of JSON)."""
    given = "" if event_id is None else f"id: {event_id}\n"
    return f"{given}event: {event}\ndata: {data}\n\n".encode()


def _lines(source: ApiSource, found: list[tuple[float | None, str]]) -> list[LogLine]:
    return [LogLine(ts=at, text=source.redact(text)) for at, text in found]


async def _open(
    source: ApiSource, ref: str, replica: int, job: int, attempt: int | None
) -> tuple[ResourceState, JobRecord, JobsAPI]:
    run = source.find_run(ref)
    try:
        record = select_job(run, replica, job, attempt)
    except DstackPlanError as e:
        raise NotFound(str(e)) from None
    try:
        agent, _ = await open_job(source.project, run, record)
    except (AgentError, ProviderError):
        raise
    except DstackPlanError as e:  # the agent no longer has the job
        raise NotFound(str(e)) from None
    return run, record, agent
