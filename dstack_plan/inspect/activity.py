"""Telling agents that someone uses a dev environment (`dstack attach`, `dstack exec`): the
job's `last_activity_at`, from which watch counts `inactivity_duration`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from dstack_plan.agent.protocol import FINISHED_STATUSES
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.records import JobRecord, RunRecord

if TYPE_CHECKING:
    from dstack_plan.project import Project
    from dstack_plan.state.model import ResourceState, State

log = logging.getLogger(__name__)

TOUCH_EVERY = 30.0
"""Seconds between touches while attached (well under any useful inactivity_duration)."""
MAX_CONCURRENT = 16


def dev_jobs(
    state: State, hosts: Collection[tuple[str, str]] | None = None
) -> list[tuple[ResourceState, JobRecord]]:
    """The active jobs of the dev environments in `state`; only those on `hosts` ((fleet,
    host) pairs, as `Machine.host` names them) when given."""
    found = []
    for run in state.resources.values():
        if run.kind != "dev-environment" or run.tainted:
            continue
        record = RunRecord.of(run)
        for job in record.jobs:
            if job.status in FINISHED_STATUSES:
                continue
            if hosts is None or (record.fleet, job.host) in hosts:
                found.append((run, job))
    return found


async def touch_jobs(
    project: Project, jobs: Sequence[tuple[ResourceState, JobRecord]], state: State
) -> int:
    """Touch each job on its agent, side by side; how many were touched. Best effort: a job
    that cannot be touched (its host down, an agent that predates touches) is logged and
    skipped, as activity is a hint, not the user's work."""
    from dstack_plan.inspect.runs import job_agent

    limit = asyncio.Semaphore(MAX_CONCURRENT)

    async def one(run: ResourceState, job: JobRecord) -> bool:
        async with limit:
            try:
                agent = await job_agent(project, run, job, state)
                await agent.touch(job.id)
            except DstackPlanError as e:
                log.debug("%s: could not record activity of %s: %s", run.address, job.id, e)
                return False
            return True

    return sum(await asyncio.gather(*(one(run, job) for run, job in jobs)))


async def keep_touching(
    project: Project, runs: Sequence[ResourceState], every: float = TOUCH_EVERY
) -> None:
    """Touch the active jobs of the dev environments among `runs` now and every `every`
    seconds, until cancelled (`dstack attach` runs it while attached)."""
    addresses = {r.address for r in runs if r.kind == "dev-environment"}
    if not addresses:
        return
    while True:
        try:
            state = (await asyncio.to_thread(project.backend.read)).state
            jobs = [(r, j) for r, j in dev_jobs(state) if r.address in addresses]
            await touch_jobs(project, jobs, state)
        except DstackPlanError as e:  # a state read that failed: try again next time
            log.debug("could not record activity: %s", e)
        await project.clock.sleep(every)
