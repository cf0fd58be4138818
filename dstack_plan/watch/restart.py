"""Starting a run's jobs again, as watch decides: the whole run (a task, every node of a
multi-node task; a queued or scheduled run) or only some replicas of a service.

Both go through the run handler apply uses (`RunHandler.start`: placed now, never queued or
scheduled again), so a restarted job is placed, wired and recorded exactly as an applied one;
the entry keeps its address, spec and dependencies, and gets the new jobs (a new generation
for a whole restart). Callers commit the returned entry.

Both first ask whether the run may still be acted on (`superseded.still_current`, from the
state as the tick read it): a destroy that committed since, or works now, wins, and nothing
is started.

Before either, a retry records the jobs it replaces as an ended attempt (`end_attempt`,
`runs/attempts.py`): they are stopped but stay on their agents, with their logs, and neither
restart removes them (the replacements get ids of their own); the jobs of an attempt that
falls out of the last ten kept are removed then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from dstack_plan.agent.protocol import TERMINATED_BY_SERVER
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.errors import AgentError, DstackPlanError
from dstack_plan.plan.model import Action, Placement, ResourceChange
from dstack_plan.runs.attempts import Attempt, attempts_of, with_attempts, with_ended
from dstack_plan.runs.handler import MAX_CONCURRENT_STOPS, STOP_WAIT_SLACK, RunHandler
from dstack_plan.runs.queueing import QUEUED_KEY, Queued
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.state.model import ResourceState, State, timestamp
from dstack_plan.watch.reachability import lost_jobs, without_lost_jobs
from dstack_plan.watch.superseded import still_current

if TYPE_CHECKING:
    from dstack_plan.project import Project

log = logging.getLogger(__name__)


def _change(current: ResourceState, action: Action) -> ResourceChange:
    record = RunRecord.of(current)
    return ResourceChange(
        address=current.address,
        kind=current.kind,
        name=current.name,
        provider=current.provider,
        action=action,
        reason="restarted by watch (retry)",
        before=dict(current.spec),
        after=dict(current.spec),
        # no hosts: placed again now, on the fleet as it is
        placement=Placement(fleet=record.fleet, provider=current.provider),
    )


async def restart_run(
    project: Project, current: ResourceState, ctx: ApplyContext, *, read: State
) -> ResourceState:
    """Stop every job of the run, submit them all again; the updated entry. The jobs the
    entry records (its current ones, those of its earlier attempts) stay on their agents,
    finished; any other of the run (a submission cut short) is removed.

    Placed now, whatever the run's schedule says; `NoCapacity` when no host has room (the old
    jobs have ended by then: the caller queues the run, see `queued_entry`). `Superseded`,
    touching nothing, when the state moved on since the tick read it (`read`)."""
    await still_current(project, read, current.address)
    handler = project.handlers()[current.kind]
    # jobs given up on a host that stopped answering cannot be removed there now: watch
    # stops them once it answers (watch/reachability.py); the retry must not wait for it
    if isinstance(handler, RunHandler):
        # the jobs it records (an ended attempt's: `end_attempt`) stay, with their logs
        await handler.delete(without_lost_jobs(current), ctx, keep_recorded=True)
    else:
        await handler.delete(without_lost_jobs(current), ctx)
    # a run's own `create` would queue or schedule it again: watch starts it
    start = handler.start if isinstance(handler, RunHandler) else handler.create
    outcome = await start(_change(current, Action.CREATE), ctx)
    attributes = {**current.attributes, **outcome.attributes}
    attributes.pop(QUEUED_KEY, None)
    attributes.pop("termination_reason", None)
    return current.updated(
        now=timestamp(project.clock), status=outcome.status, attributes=attributes
    )


def queued_entry(
    project: Project, current: ResourceState, why: str, **attributes: Any
) -> ResourceState:
    """The run `current` waiting for capacity: `pending`, no jobs, `queued` (its `since`
    kept when it was queued already, and `attempted_at` now), with `attributes` on top."""
    now = project.clock.now()
    before = Queued.of(current.attributes)
    queued = (
        Queued(since=now, why=why)
        if before is None
        else Queued(since=before.since, why=why, attempted_at=now)
    )
    record = RunRecord.of(current).with_jobs(())
    merged = {
        **current.attributes,
        **record.to_json(),
        QUEUED_KEY: queued.to_json(),
        **attributes,
    }
    merged.pop("termination_reason", None)
    return current.updated(now=timestamp(project.clock), status="pending", attributes=merged)


async def restart_jobs(
    project: Project,
    current: ResourceState,
    job_ids: Collection[str],
    ctx: ApplyContext,
    *,
    read: State,
) -> ResourceState:
    """Replace only the jobs `job_ids` of a service (their replicas start again, the others
    keep serving); the updated entry. `Superseded` as `restart_run`.

    The replaced jobs are stopped and stay on their agents (`end_attempt` recorded them);
    the new ones get a generation of their own (`RunHandler.update` sees their ids taken)."""
    await still_current(project, read, current.address)
    record = RunRecord.of(current)
    ended = await _stopped(project, current, [j for j in record.jobs if j.id in job_ids], ctx)
    recorded = {j.id for a in attempts_of(current.attributes) for j in a.jobs}
    for job in ended:
        if job.id not in recorded:  # not an ended attempt's: removed, as before attempts
            await _remove(project, current, job, ctx)
    kept = record.with_jobs([j for j in record.jobs if j.id not in job_ids])
    trimmed = current.updated(
        now=current.updated_at, attributes={**current.attributes, **kept.to_json()}
    )
    handler = project.handlers()[current.kind]
    outcome = await handler.update(_change(trimmed, Action.UPDATE), trimmed, ctx)
    return current.updated(
        now=timestamp(project.clock), status=outcome.status, attributes=outcome.attributes
    )


async def end_attempt(
    project: Project,
    current: ResourceState,
    ctx: ApplyContext,
    *,
    read: State,
    job_ids: Collection[str] | None = None,
) -> ResourceState:
    """Record the jobs of `current` a retry replaces (all of them, or `job_ids`) as its next
    ended attempt (`runs/attempts.py`): those still active are stopped (each within its
    graceful window) and stay on their agents, with their logs. The jobs of the attempts
    that fall out of the kept ones are removed from their agents now. The updated entry
    (its current jobs as they were: the restart replaces them); `Superseded`, touching
    nothing, as `restart_run`."""
    await still_current(project, read, current.address)
    record = RunRecord.of(current)
    jobs = [j for j in record.jobs if job_ids is None or j.id in job_ids]
    if not jobs:
        return current
    ended = await _stopped(project, current, jobs, ctx)
    attributes, dropped = with_ended(current.attributes, ended, project.clock.now())
    if dropped:
        kept = [a for a in attempts_of(attributes) if a not in dropped]
        left = [a for a in dropped if not await _remove_attempt(project, current, a, ctx)]
        attributes = with_attempts(attributes, sorted([*left, *kept], key=lambda a: a.attempt))
    return current.updated(now=current.updated_at, attributes=attributes)


async def _stopped(
    project: Project, current: ResourceState, jobs: Sequence[JobRecord], ctx: ApplyContext
) -> list[JobRecord]:
    """`jobs` of `current` once ended: each still active is stopped (its graceful window,
    `terminated_by_server`) and waited for; the records as their agents say last. A job
    given up for its host (watch/reachability.py), or one its agent no longer has, is left as
    recorded."""
    from dstack_plan.inspect.runs import job_jobs
    from dstack_plan.inspect.stop import stop_timeout

    state = ctx.current_state()
    lost = lost_jobs(current)
    timeout = stop_timeout(current)
    limit = asyncio.Semaphore(MAX_CONCURRENT_STOPS)

    async def one(job: JobRecord) -> JobRecord:
        if job.id in lost:
            return job
        async with limit:
            agent = await job_jobs(project, current, job, state)
            try:
                info = await agent.get_job(job.id)
                if not info.finished:
                    await agent.stop(job.id, timeout=timeout, reason=TERMINATED_BY_SERVER)
                    info = await agent.wait(job.id, timeout=timeout + STOP_WAIT_SLACK)
            except AgentError as e:
                if e.status != 404:
                    raise
                return job
            return job.refreshed(info)

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def _remove(
    project: Project, current: ResourceState, job: JobRecord, ctx: ApplyContext
) -> None:
    from dstack_plan.inspect.runs import job_jobs

    if job.id in lost_jobs(current):  # its host does not answer: see restart_run
        return
    agent = await job_jobs(project, current, job, ctx.current_state())
    try:
        await agent.delete(job.id, force=True)
    except AgentError as e:
        if e.status != 404:
            raise


async def _remove_attempt(
    project: Project, current: ResourceState, attempt: Attempt, ctx: ApplyContext
) -> bool:
    """Remove the jobs of an attempt no longer kept from their agents; False when one could
    not be (the attempt stays recorded, so the next retry or a delete tries again)."""
    try:
        for job in attempt.jobs:
            await _remove(project, current, job, ctx)
    except DstackPlanError as e:
        log.warning(
            "%s: could not remove the jobs of attempt %d: %s", current.address, attempt.attempt, e
        )
        return False
    return True
