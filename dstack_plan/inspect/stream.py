"""Streaming the logs of several jobs at once to one binary stream (`apply --attach`).

Each job's bytes are written in order. With several jobs, output is cut at line ends and each
line is prefixed with its job id, so lines of different jobs never interleave mid-line.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from dstack_plan.inspect.runs import job_jobs, job_records
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import JobInfo
    from dstack_plan.project import Project
    from dstack_plan.runs.records import JobRecord

_CONCURRENT_STREAMS = 32


class LinePrefixer:
    """Turns a job's byte stream into whole lines starting with `prefix`."""

    def __init__(self, prefix: bytes):
        self.prefix = prefix
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """The complete lines `data` finishes, prefixed; the rest waits for more bytes."""
        text = self._partial + data
        cut = text.rfind(b"\n") + 1
        self._partial = text[cut:]
        lines = text[:cut].splitlines(keepends=True)
        return b"".join(self.prefix + line for line in lines)

    def flush(self) -> bytes:
        """The last, unterminated line (given a newline), or nothing."""
        rest, self._partial = self._partial, b""
        return self.prefix + rest + b"\n" if rest else b""


@dataclass
class AttachResult:
    """How the attached jobs ended."""

    finished: dict[str, JobInfo] = field(default_factory=dict)
    """Jobs that ended while attached (or before), by id."""
    detached: bool = False
    """Streaming stopped before every job ended (Ctrl-C, or runs that never end)."""

    @property
    def failed(self) -> list[str]:
        """Ids of jobs that ended other than `done` (failed, non-zero exit, stopped)."""
        return [i for i, info in self.finished.items() if not _succeeded(info)]


def _succeeded(info: JobInfo) -> bool:
    return info.status.value == "done" and not info.exit_code


def attached_runs(project: Project, addresses: list[str]) -> list[ResourceState]:
    """The runs among `addresses` that state records, with their jobs."""
    from dstack_plan.config.kinds import RUN_KINDS

    state = project.backend.read().state
    found = [state.get(a) for a in addresses]
    return [r for r in found if r is not None and r.kind in RUN_KINDS]


async def stream_runs(
    project: Project,
    runs: list[ResourceState],
    out: BinaryIO,
    stop: asyncio.Event | None = None,
) -> AttachResult:
    """Copy the logs of every job of `runs` to `out` until all jobs end or `stop` is set."""
    jobs = [(run, record) for run in runs for record in job_records(run)]
    result = AttachResult()
    if not jobs:
        return result
    width = max(len(r.id) for _, r in jobs)
    state = project.backend.read().state
    several = len(jobs) > 1
    limit = asyncio.Semaphore(_CONCURRENT_STREAMS)

    async def follow(run: ResourceState, record: JobRecord) -> None:
        job_id = record.id
        prefix = f"{job_id:<{width}} | ".encode() if several else b""
        lines = LinePrefixer(prefix) if several else None
        async with limit:
            agent = await job_jobs(project, run, record, state)
            async for chunk in agent.follow_logs(job_id):
                out.write(lines.feed(chunk.data) if lines else chunk.data)
                out.flush()
            if lines:
                out.write(lines.flush())
                out.flush()
            result.finished[job_id] = await agent.get_job(job_id)

    tasks = [asyncio.create_task(follow(run, r)) for run, r in jobs]
    job_of = dict(zip(tasks, jobs, strict=True))
    gangs_stopped: set[str] = set()
    waiter = asyncio.create_task(stop.wait()) if stop is not None else None
    try:
        pending: set[asyncio.Task[Any]] = set(tasks) | ({waiter} if waiter else set())
        while any(not t.done() for t in tasks):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is waiter:
                    result.detached = True
                    return result
                task.result()  # an agent error ends the attach
                await _keep_gang(project, job_of[task][0], result, out, state, gangs_stopped)
        return result
    finally:
        for task in [*tasks, *([waiter] if waiter else [])]:
            task.cancel()
        await asyncio.gather(*tasks, *([waiter] if waiter else []), return_exceptions=True)


async def _keep_gang(
    project: Project,
    run: ResourceState,
    result: AttachResult,
    out: BinaryIO,
    state: State,
    stopped: set[str],
) -> None:
    """Once one of `run`'s jobs ended: stop the other nodes of a multi-node task when one
    failed, or when the master is done and the run says `stop_criteria: master-done` (see
    `apply.gang`). `stopped`: the runs already stopped so, which are left alone."""
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.errors import AgentError
    from dstack_plan.inspect.stop import stop_timeout
    from dstack_plan.plan.normalize import spec_from_normalized
    from dstack_plan.runs.gang import gang_leftovers

    spec = spec_from_normalized(run.kind, run.spec)
    assert isinstance(spec, RunSpec)
    if run.address in stopped:
        return
    # a job not finished yet is still being followed: it runs, whatever apply recorded
    jobs = [
        j._replace(
            status=result.finished[j.id].status.value if j.id in result.finished else "running"
        )
        for j in job_records(run)
    ]
    stops, why = gang_leftovers(spec, jobs)
    if not stops:
        return
    stopped.add(run.address)
    out.write(f"{run.address}: {why}\n".encode())
    out.flush()
    timeout = stop_timeout(run)
    for other in stops:
        agent = await job_jobs(project, run, other, state)
        try:
            await agent.stop(other.id, timeout=timeout)
        except AgentError:
            pass  # it ended meanwhile (or is gone): nothing left to stop
