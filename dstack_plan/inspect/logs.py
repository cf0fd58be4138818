"""Reading a run's job logs: choosing the job (of the latest attempt, or of an earlier one
watch's retry kept: `runs/attempts.py`), `--since`, raw bytes to a binary stream.

The agent dates what it stores (a coarse time index: see `agent/logstore.py`), so `--since T`
starts each log at the first output written at or after T; at most a second of older output
may come with it, and nothing written after T is left out. (With an agent older than the
index, a job that finished before T is skipped and any other's whole retained log is printed.)
`--json` lines are built by `inspect/json_logs.py`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, BinaryIO

from dstack_plan.errors import AgentError, DstackPlanError
from dstack_plan.inspect.runs import find_run, job_jobs
from dstack_plan.runs.attempts import attempt_jobs
from dstack_plan.runs.records import JobRecord
from dstack_plan.state.model import ResourceState

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import JobInfo
    from dstack_plan.agent.jobs_api import JobsAPI
    from dstack_plan.project import Project


def parse_since(text: str, now: float) -> float:
    """Epoch seconds for `--since`: a duration back from `now` (`10m`, `2h`, `90`) or an
    RFC 3339 time (`2024-05-01T12:00:00Z`; without an offset it is UTC)."""
    from dstack_plan.config.units import parse_duration

    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise DstackPlanError(
            f"--since {text!r}: expected a duration (10m, 2h) or an RFC 3339 time "
            "(2024-05-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def select_job(
    run: ResourceState, replica: int = 0, job: int = 0, attempt: int | None = None
) -> JobRecord:
    """The job record of `run` for replica `replica` and job (node) number `job`, of its
    attempt `attempt` (1: the first submission; None: the latest, its current jobs). Raises
    DstackPlanError naming what there is when there is no such attempt or job."""
    records = sorted(attempt_jobs(run, attempt), key=lambda r: r.slot)
    for record in records:
        if record.slot == (replica, job):
            return record
    have = ", ".join(f"replica={r.replica} job={r.node}" for r in records)
    which = "" if attempt is None else f" in attempt {attempt}"
    raise DstackPlanError(
        f"{run.address} has no job replica={replica} job={job}{which} "
        f"(it has: {have or 'no jobs'})"
    )


def finished_before(info: JobInfo, since: float | None) -> bool:
    """True when all of the job's output predates `since` (cheap: no log is read)."""
    return since is not None and info.finished_at is not None and info.finished_at < since


async def write_logs(
    project: Project,
    ref: str,
    out: BinaryIO,
    *,
    replica: int = 0,
    job: int = 0,
    follow: bool = False,
    since: float | None = None,
    attempt: int | None = None,
) -> JobInfo | None:
    """Copy one job's log of run `ref` (of its attempt `attempt`, default the latest) to
    `out`; with `follow`, until the job ends.

    Returns the job as the agent last reported it, or None when `since` skipped it.
    """
    run = find_run(project.backend.read().state, ref)
    record = select_job(run, replica, job, attempt)
    job_id = record.id
    agent, info = await open_job(project, run, record)
    if finished_before(info, since):
        return None
    if follow:
        async for chunk in agent.follow_logs(job_id, since=since):
            out.write(chunk.data)
            out.flush()
        return await agent.get_job(job_id)
    offset = 0
    first = True
    while True:
        chunk = await agent.logs(job_id, offset, since=since if first else None)
        first = False
        out.write(chunk.data)
        if chunk.next_offset <= offset or chunk.next_offset >= (chunk.size or 0):
            out.flush()
            return info
        offset = chunk.next_offset


async def open_job(
    project: Project, run: ResourceState, record: JobRecord
) -> tuple[JobsAPI, JobInfo]:
    """The agent of job `record` of `run`, and the job as it reports it now.

    Raises DstackPlanError when the agent no longer has the job (its logs went with it).
    """
    agent = await job_jobs(project, run, record)
    try:
        return agent, await agent.get_job(record.id)
    except AgentError as e:
        if e.status == 404:
            raise DstackPlanError(
                f"{run.address}: job {record.id} is no longer on its agent; its logs are gone"
            ) from None
        raise
