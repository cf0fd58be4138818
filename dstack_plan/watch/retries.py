"""Carrying out the retry policy (`watch/retry.py`) on the runs a tick found failed.

For each run with a failed job, the jobs are asked of their agents (exit code, reason, when
they ended), the policy decides, and the decision is done: the whole run or the failed
replicas submitted again (`watch/restart.py`; the jobs replaced are kept, with their logs, as
the run's ended attempt: `runs/attempts.py`), or the run given up as `failed`. What the
policy needs next time (`RetryState`) is kept in the run's state attributes under `retry`.
The updated entries go back to the loop, which commits them with the rest of the tick.

A job `preempted` (stopped to give its capacity back) ended `terminated`, but counts as an
interruption: a run whose retry covers it waits `pending` (its other jobs stopped) and is
placed again; one whose retry does not ends `terminated` with the reason `preempted`. The
job's event (`running -> terminated: preempted: ...`) is recorded even when the run is
placed again in the very tick that found it ended.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.protocol import PREEMPTED, TERMINATED_BY_SERVER
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import AgentError, DstackPlanError
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.runs.queueing import STOPPED_BY_USER, NoCapacity
from dstack_plan.runs.records import RETRY_KEY, RunRecord, run_span_id
from dstack_plan.state.events import Event
from dstack_plan.state.model import ResourceState, State, timestamp
from dstack_plan.watch.restart import end_attempt, queued_entry, restart_jobs, restart_run
from dstack_plan.watch.retry import decide_retry
from dstack_plan.watch.retry_model import JobOutcome, RetryDecision, RetryState, preempted
from dstack_plan.watch.superseded import Superseded, log_superseded
from dstack_plan.watch.tick import Acted, Tick

if TYPE_CHECKING:
    from dstack_plan.apply.handlers import ApplyContext
    from dstack_plan.project import Project

log = logging.getLogger(__name__)


class RetryPolicy:
    """The retry policy, as an actor of the loop."""

    name = "retry"

    async def act(self, tick: Tick) -> Acted:
        changed, resubmitted = await retry_failed(
            tick.project, tick.state, tick.now, read=tick.read
        )
        events = preempted_events(tick.read, tick.state, changed, tick.now)
        return Acted(changed=changed, resubmitted=resubmitted, events=events)


def preempted_events(
    read: State, refreshed: State, changed: dict[str, ResourceState], now: float
) -> list[Event]:
    """The ends of preempted jobs that the loop's own events would miss: a run placed again
    in the tick that found its job preempted no longer has the job, so no status change of
    it is seen. One `job` event each (`running -> terminated: preempted: ...`)."""
    events: list[Event] = []
    for address, entry in changed.items():
        run, old = refreshed.resources.get(address), read.resources.get(address)
        if run is None:
            continue
        was = {j.id: j.status for j in RunRecord.of(old).jobs} if old is not None else {}
        kept = {j.id for j in RunRecord.of(entry).jobs}
        for job in RunRecord.of(run).jobs:
            if job.id in kept or not preempted(job.reason) or was.get(job.id) == job.status:
                continue
            events.append(
                Event(
                    time=now,
                    address=address,
                    kind="job",
                    span_id=run_span_id(entry),
                    old_status=was.get(job.id),
                    new_status=job.status,
                    job_id=job.id,
                    host=job.host,
                    reason=job.reason,
                )
            )
    return events


async def retry_failed(
    project: Project, state: State, now: float, *, read: State
) -> tuple[dict[str, ResourceState], int]:
    """The entries of `state` the retry policy changed (by address), and how many runs it
    submitted again; `read` is the state as the tick read it (a run the state no longer has
    as it was then is not submitted again: `superseded.py`)."""
    changed: dict[str, ResourceState] = {}
    resubmitted = 0
    ctx = project.context(state)
    for address, run in state.resources.items():
        record = RunRecord.of(run)
        if run.tainted or not any(_failed(j.status, j.reason) for j in record.jobs):
            continue
        if run.attributes.get("termination_reason") in ("retry_limit_exceeded", STOPPED_BY_USER):
            continue  # given up already, or the user stopped it
        spec = spec_from_normalized(run.kind, run.spec)
        assert isinstance(spec, RunSpec)
        try:
            outcomes = await _outcomes(project, run, state)
            retry_state = RetryState.from_json(run.attributes.get(RETRY_KEY))
            decision = decide_retry(
                spec, outcomes, retry_state, now, submitted_at=run.created_at.timestamp()
            )
            updated = await _carry_out(project, run, decision, ctx, read)
        except Superseded as e:
            log_superseded(e)
            continue
        except DstackPlanError as e:
            log.warning("%s: retry failed: %s", address, e)
            continue
        if updated is not None:
            changed[address] = updated
            resubmitted += decision.action == "resubmit"
    return changed, resubmitted


def _failed(status: str, reason: str | None) -> bool:
    """A job record the policy looks at: failed, or preempted (which ends `terminated`; other
    `terminated` reasons, a user's, a limit's or watch's own stop, are not failures)."""
    return status == "failed" or (status == "terminated" and preempted(reason))


async def _outcomes(project: Project, run: ResourceState, state: State) -> list[JobOutcome]:
    from dstack_plan.inspect.runs import job_jobs
    from dstack_plan.watch.reachability import lost_jobs

    lost = lost_jobs(run)
    outcomes = []
    for job in RunRecord.of(run).jobs:
        if job.id in lost:  # given up for its host (watch/reachability.py): no agent to ask
            outcomes.append(JobOutcome.unreachable(job, lost[job.id]))
            continue
        agent = await job_jobs(project, run, job, state)
        try:
            info: JobInfo = await agent.get_job(job.id)
        except AgentError as e:
            if e.status != 404:
                raise
            continue
        outcomes.append(JobOutcome.of(job, info))
    return outcomes


async def _carry_out(
    project: Project,
    run: ResourceState,
    decision: RetryDecision,
    ctx: ApplyContext,
    read: State,
) -> ResourceState | None:
    now = timestamp(project.clock)
    attributes = {**run.attributes, RETRY_KEY: decision.state.to_json()}
    if decision.action == "none":
        return None
    if decision.action in ("wait", "fail"):
        # a run waiting for its retry is `pending` (as dstack's), not failed
        status = "failed" if decision.action == "fail" else "pending"
        if decision.action == "fail" and decision.reason:
            attributes["termination_reason"] = decision.reason
        if decision.preempted:
            # a preempted run waits `pending` (retried) or ends `terminated` (not covered):
            # not `failed`; what is left of it goes with it
            status = "terminated" if decision.reason == PREEMPTED else "pending"
            before = read.resources.get(run.address)
            if before is None or before.status != status:
                log.info("%s: %s", run.address, decision.message)
            await _stop(project, run, decision.stop, ctx)
        return run.updated(now=now, status=status, attributes=attributes)
    log.info("%s: %s", run.address, decision.message or "resubmitting")
    with_state = run.updated(now=run.updated_at, attributes=attributes)
    await _stop(project, run, decision.stop, ctx)
    slots = set(decision.slots)
    ids = [j.id for j in RunRecord.of(run).jobs if (j.replica, j.node) in slots]
    # the jobs replaced stay on their agents as an ended attempt (`runs/attempts.py`)
    ended = await end_attempt(
        project, with_state, ctx, read=read, job_ids=None if decision.whole_run else ids
    )
    if decision.whole_run:
        try:
            return await restart_run(project, ended, ctx, read=read)
        except NoCapacity as e:
            # its jobs have ended: it waits for room like a run apply queued (`watch/pending.py`
            # places it, or fails it when its retry does not cover no-capacity)
            log.info(
                "%s: no room to resubmit it, queued: %s",
                run.address,
                e.detail,
                extra={"event": "run_queued", "address": run.address, "resource_type": "run"},
            )
            return queued_entry(project, ended, e.detail)
    return await restart_jobs(project, ended, ids, ctx, read=read)


async def _stop(
    project: Project, run: ResourceState, job_ids: tuple[str, ...], ctx: ApplyContext
) -> None:
    """Stop the jobs `job_ids` of `run` gracefully (its `stop_duration`), as watch's own."""
    from dstack_plan.inspect.runs import job_jobs
    from dstack_plan.inspect.stop import stop_timeout

    if not job_ids:
        return
    state = ctx.current_state()
    for job in RunRecord.of(run).jobs:
        if job.id in job_ids:
            agent = await job_jobs(project, run, job, state)
            await agent.stop(job.id, timeout=stop_timeout(run), reason=TERMINATED_BY_SERVER)
