"""Stopping a run's jobs by hand (`dstack stop`), then recording their status in state.

Like `watch`, this does not take the operation lock: stopping must work while an apply is
running, and the state update is a small compare-and-swap commit that re-reads the latest
state, so it never overwrites what a concurrent apply wrote. Jobs stay on their agent, so
their logs can still be read; the run stays in state, finished, with `termination_reason:
stopped_by_user`. A run with nothing started (queued or scheduled, `pending`) becomes
`terminated`: watch never starts it. So does a run waiting for its retry (its jobs ended,
`pending` until watch resubmits it): the stop cancels the retry.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dstack_plan.errors import AgentError
from dstack_plan.inspect.runs import find_run, job_jobs, job_records
from dstack_plan.runs.queueing import QUEUED_KEY, STOPPED_BY_USER
from dstack_plan.runs.records import RETRY_KEY, retry_due_at
from dstack_plan.state.model import ResourceState, State, timestamp

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import JobInfo
    from dstack_plan.agent.jobs_api import JobsAPI
    from dstack_plan.project import Project
    from dstack_plan.runs.records import JobRecord

STOP_WAIT_SLACK = 15.0
"""Seconds allowed beyond the stop timeout for the agent to report a job finished."""
_CONCURRENT_STOPS = 8


@dataclass(frozen=True)
class StopResult:
    """What `stop_run` did."""

    address: str
    status: str
    """The run's status after stopping (as recorded in state)."""
    stopped: tuple[str, ...]
    """Ids of the jobs that were still active and got stopped."""
    already_finished: tuple[str, ...]
    """Ids of jobs that had ended before (or are gone from their agent)."""
    retry_cancelled: bool = False
    """The run was waiting for its retry, which will not happen now."""


def stop_timeout(run: ResourceState) -> float:
    """Seconds between SIGTERM and SIGKILL: the run's `stop_duration` (0 when off)."""
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.plan.normalize import spec_from_normalized
    from dstack_plan.runs.jobs import stop_seconds

    spec = spec_from_normalized(run.kind, run.spec)
    assert isinstance(spec, RunSpec)
    return stop_seconds(spec)


async def stop_run(project: Project, ref: str, *, abort: bool = False) -> StopResult:
    """Stop every job of run `ref` (gracefully within its stop_duration, or `abort` at once),
    wait until they have ended, and commit the run's new status and job statuses."""
    from dstack_plan.apply.records import deposed_of
    from dstack_plan.runs.handler import run_status

    state = project.backend.read().state
    run = find_run(state, ref)
    timeout = 0.0 if abort else stop_timeout(run)
    limit = asyncio.Semaphore(_CONCURRENT_STOPS)

    async def one(job: JobRecord) -> tuple[JobInfo | None, bool]:
        async with limit:
            agent = await job_jobs(project, run, job, state)
            return await _stop_job(agent, job.id, timeout, abort)

    ids = [r.id for r in job_records(run)]
    # jobs of old objects a failed create-before-destroy left behind (deposed) are the run's
    # too: a stop that left them running would surprise
    leftovers = [r for old in deposed_of(run) for r in job_records(old) if r.id not in ids]
    everything = job_records(run) + leftovers
    outcomes = dict(
        zip(
            [j.id for j in everything],
            await asyncio.gather(*(one(j) for j in everything)),
            strict=True,
        )
    )
    infos = {i: info for i, (info, _) in outcomes.items() if info is not None and i in ids}
    status = run_status(list(infos.values())) if ids else run.status
    if status == "pending" and not ids:
        status = "terminated"  # queued or scheduled, nothing started: watch never starts it
    waiting = retry_due_at(run.attributes) is not None
    if waiting:
        status = "terminated"  # its jobs had ended; the user ends the run, not its failure
    statuses = {i: info.status.value for i, info in infos.items()}

    def record(state: State) -> State:
        current = state.get(run.address)
        if current is None:  # destroyed or forgotten meanwhile: nothing left to record
            return state
        jobs = [
            r._replace(status=statuses[r.id]) if r.id in statuses else r
            for r in job_records(current)
        ]
        attributes = {
            **current.attributes,
            "jobs": [j.to_json() for j in jobs],
            # neither a retry nor a schedule starts it again (re-apply with --replace does)
            "termination_reason": STOPPED_BY_USER,
        }
        attributes.pop(QUEUED_KEY, None)  # it waits for nothing any more
        retry = attributes.get(RETRY_KEY)
        if isinstance(retry, dict):  # its history stays; only the next attempt is cancelled
            attributes[RETRY_KEY] = {**retry, "next_attempt_at": None}
        now = timestamp(project.clock)
        return state.with_resource(current.updated(now=now, status=status, attributes=attributes))

    from dstack_plan.state.commit import commit_async

    await commit_async(project.backend, record)
    if run.kind == "dev-environment":  # its jobs are gone: so is the SSH entry attach wrote
        from dstack_plan.runs.dev_ssh import forget

        forget(run)
    return StopResult(
        address=run.address,
        status=status,
        stopped=tuple(i for i, (_, stopped) in outcomes.items() if stopped),
        already_finished=tuple(i for i, (_, stopped) in outcomes.items() if not stopped),
        retry_cancelled=waiting,
    )


async def _stop_job(
    agent: JobsAPI, job_id: str, timeout: float, abort: bool
) -> tuple[JobInfo | None, bool]:
    """(the job after stopping or None if it is gone, whether it was still active)."""
    try:
        info = await agent.get_job(job_id)
        if info.finished:
            return info, False
        await agent.stop(job_id, timeout=timeout, abort=abort)
        return await agent.wait(job_id, timeout=timeout + STOP_WAIT_SLACK), True
    except AgentError as e:
        if e.status == 404:
            return None, False
        raise
