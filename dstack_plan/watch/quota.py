"""Enforces the daily GPU-hour quotas: once a namespace (or a user in it) has used more
GPU-hours today than `.dstack/quotas.yml` allows, its jobs that hold GPUs are stopped.

Each tick (only when the project has a quota file) the usage is read from the refreshed state
(`runs/usage.py`) and checked (`scheduler.quotas.over_daily`). Every unfinished job that holds
GPUs, of every run in a namespace over its limit (or of the user over theirs), is stopped with
`terminated_by_server` and the run's `stop_duration` as the graceful window: it ends
`terminated`, which the retry policy leaves alone. The run records why
(`termination_reason: quota_exceeded: ...`, which its status event carries), and an event per
job names the namespace, user, limit and usage. Jobs without GPUs use no GPU-hours and run on.
Queued and scheduled runs are held back by `watch/pending.py` (`runs/quota_gate.py`) until
the next UTC day, or until the limit is raised.
"""

from __future__ import annotations

import logging

from dstack_plan.agent.protocol import FINISHED_STATUSES, TERMINATED_BY_SERVER, TERMINATING
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.quotas import load_quotas
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.records import JobRecord, RunRecord, run_span_id
from dstack_plan.runs.usage import namespace_usage, run_usage
from dstack_plan.scheduler.quotas import Violation, over_daily
from dstack_plan.state.events import Event
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)

QUOTA_EXCEEDED = "quota_exceeded"
"""The start of the `termination_reason` of a run whose jobs watch stopped for a quota."""
_SKIPPED = frozenset({*FINISHED_STATUSES, TERMINATING})
"""Jobs not stopped (again): over, or already stopping."""


class QuotaEnforcer:
    """The daily quotas, as an actor of the loop (see the module docstring)."""

    name = "quotas"

    async def act(self, tick: Tick) -> Acted:
        quotas = load_quotas(tick.project.directory)
        if not quotas.namespaces:
            return Acted()
        over = over_daily(quotas, namespace_usage(tick.state, tick.now))
        acted = Acted()
        if not over:
            return acted
        for run in tick.state.resources.values():
            if run.kind not in RUN_KINDS or run.tainted:
                continue
            record = RunRecord.of(run)
            violation = _broken(over, record)
            if violation is None or not run_usage(run, tick.now).gpus:
                continue
            jobs = [j for j in record.jobs if j.status not in _SKIPPED and j.gpus != 0]
            events = [e for j in jobs if (e := await _stop(tick, run, j, violation)) is not None]
            if not events:
                continue
            acted.events += events
            reason = f"{QUOTA_EXCEEDED}: {violation.text()}"
            attributes = {**run.attributes, "termination_reason": reason}
            acted.changed[run.address] = run.updated(now=run.updated_at, attributes=attributes)
        return acted


def _broken(over: list[Violation], record: RunRecord) -> Violation | None:
    """The first daily limit broken that counts `record`'s run: its namespace's own, or its
    user's."""
    for violation in over:
        if violation.namespace == record.namespace and violation.user in (None, record.user):
            return violation
    return None


async def _stop(tick: Tick, run: ResourceState, job: JobRecord, why: Violation) -> Event | None:
    """Stop `job` for `why`; the event that says so, or None when the stop failed (logged: the
    next tick tries again)."""
    from dstack_plan.inspect.runs import job_jobs
    from dstack_plan.inspect.stop import stop_timeout

    span = run_span_id(run)
    text = why.text()
    user = RunRecord.of(run).user
    if why.user is None and user is not None:
        text += f" (run of user {user})"  # the namespace's limit: say whose run it stops
    try:
        agent = await job_jobs(tick.project, run, job, tick.state)
        stopped = await agent.stop(job.id, timeout=stop_timeout(run), reason=TERMINATED_BY_SERVER)
    except DstackPlanError as e:
        log.warning("%s: could not stop %s (%s): %s", run.address, job.id, text, e)
        return None
    extra = {
        "event": QUOTA_EXCEEDED,
        "address": run.address,
        "job_id": job.id,
        "host": job.host,
        "resource_type": "job",
        "span_id": span,
    }
    log.info("%s: stopping %s: %s", run.address, job.id, text, extra=extra)
    return Event(
        time=tick.now,
        address=run.address,
        kind="job",
        span_id=span,
        old_status=job.status,
        new_status=stopped.status.value,
        job_id=job.id,
        reason=f"{QUOTA_EXCEEDED}: {text}",
        host=job.host,
    )
