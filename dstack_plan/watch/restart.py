"""Starting a run's jobs again, as watch decides: the whole run (a task, every node of a
multi-node task; a queued or scheduled run) or only some replicas of a service.

Both go through the run handler apply uses (`RunHandler.start`: placed now, never queued or
scheduled again), so a restarted job is placed, wired and recorded exactly as an applied one;
the entry keeps its address, spec and dependencies, and gets the new jobs (a new generation
for a whole restart). Callers commit the returned entry.

Both first ask whether the run may still be acted on (`superseded.still_current`, from the
state as the tick read it): a destroy that committed since, or works now, wins, and nothing
is started.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from dstack_plan.agent.protocol import TERMINATED_BY_SERVER
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.plan.model import Action, Placement, ResourceChange
from dstack_plan.runs.handler import RunHandler
from dstack_plan.runs.queueing import QUEUED_KEY, Queued
from dstack_plan.runs.records import RunRecord
from dstack_plan.state.model import ResourceState, State, timestamp
from dstack_plan.watch.reachability import lost_jobs, without_lost_jobs
from dstack_plan.watch.superseded import still_current

if TYPE_CHECKING:
    from dstack_plan.project import Project


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
    """Stop and remove every job of the run, submit them all again; the updated entry.

    Placed now, whatever the run's schedule says; `NoCapacity` when no host has room (the old
    jobs are gone by then: the caller queues the run, see `queued_entry`). `Superseded`,
    touching nothing, when the state moved on since the tick read it (`read`)."""
    await still_current(project, read, current.address)
    handler = project.handlers()[current.kind]
    # jobs given up on a host that stopped answering cannot be removed there now: watch
    # stops them once it answers (watch/reachability.py); the retry must not wait for it
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
    keep serving); the updated entry. `Superseded` as `restart_run`."""
    from dstack_plan.inspect.runs import job_agent
    from dstack_plan.inspect.stop import stop_timeout

    await still_current(project, read, current.address)
    record = RunRecord.of(current)
    state = ctx.current_state()
    lost = lost_jobs(current)  # their host does not answer: see restart_run
    for job in record.jobs:
        if job.id in job_ids and job.id not in lost:
            agent = await job_agent(project, current, job, state)
            await agent.stop(job.id, timeout=stop_timeout(current), reason=TERMINATED_BY_SERVER)
            await agent.delete(job.id, force=True)
    kept = record.with_jobs([j for j in record.jobs if j.id not in job_ids])
    trimmed = current.updated(
        now=current.updated_at, attributes={**current.attributes, **kept.to_json()}
    )
    handler = project.handlers()[current.kind]
    outcome = await handler.update(_change(trimmed, Action.UPDATE), trimmed, ctx)
    return current.updated(
        now=timestamp(project.clock), status=outcome.status, attributes=outcome.attributes
    )
