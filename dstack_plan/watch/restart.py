"""Starting a run's jobs again, as watch's retry policy decides: the whole run (a task, every
node of a multi-node task) or only some replicas of a service.

Both go through the run handler apply uses, so a restarted job is placed, wired and recorded
exactly as an applied one; the entry keeps its address, spec and dependencies, and gets the
new jobs (a new generation for a whole restart). Callers commit the returned entry.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from dstack_plan.agent.protocol import TERMINATED_BY_SERVER
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.apply.run_records import RunRecord
from dstack_plan.plan.model import Action, Placement, ResourceChange
from dstack_plan.state.model import ResourceState, timestamp

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
    project: Project, current: ResourceState, ctx: ApplyContext
) -> ResourceState:
    """Stop and remove every job of the run, submit them all again; the updated entry."""
    handler = project.handlers()[current.kind]
    await handler.delete(current, ctx)
    outcome = await handler.create(_change(current, Action.CREATE), ctx)
    attributes = {**current.attributes, **outcome.attributes}
    return current.updated(
        now=timestamp(project.clock), status=outcome.status, attributes=attributes
    )


async def restart_jobs(
    project: Project, current: ResourceState, job_ids: Collection[str], ctx: ApplyContext
) -> ResourceState:
    """Replace only the jobs `job_ids` of a service (their replicas start again, the others
    keep serving); the updated entry."""
    from dstack_plan.inspect.runs import job_agent
    from dstack_plan.inspect.stop import stop_timeout

    record = RunRecord.of(current)
    state = ctx.current_state()
    for job in record.jobs:
        if job.id in job_ids:
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
