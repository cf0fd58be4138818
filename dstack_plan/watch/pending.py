"""Places queued runs (no capacity at apply, or at a retry) when room frees up, and starts
scheduled runs when their cron fires (`runs/queueing.py` has their state attributes).

Queued runs (status `pending`, `queued` in their attributes) are placed again by the retry
backoff of `watch/retry.py` (15 s, 30 s, 1 min, 2 min, 5 min, then every 10 min), at once when
a job on their fleet ended since their last attempt, oldest first; until their retry duration
(since they were queued) is exceeded: then they fail with `retry_limit_exceeded`.

Scheduled runs (a task with `schedule.cron`) are started when a fire time has come since they
last started (or were applied): several missed fire times make one run. Once its jobs are
over (done, stopped by a limit, or failed with no retry left) the run goes back to `pending`,
without jobs, with its next fire time; a run the user stopped (`dstack stop`) is left alone.

Neither starts while its namespace or user is at a quota (`runs/quota_gate.py`): it waits as
for room, the quota as its `why`.
"""

from __future__ import annotations

import logging

from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.runs.queueing import (
    QUEUED_KEY,
    SCHEDULE_KEY,
    STOPPED_BY_USER,
    NoCapacity,
    Queued,
    Scheduled,
    next_fire,
    waits_for_capacity,
)
from dstack_plan.runs.quota_gate import hold_for_quota
from dstack_plan.runs.records import RETRY_KEY, RunRecord, run_span_id
from dstack_plan.runs.schedule import cron_due
from dstack_plan.state.model import ResourceState, State, timestamp
from dstack_plan.watch.restart import queued_entry, restart_run
from dstack_plan.watch.retry import backoff, decide_retry
from dstack_plan.watch.retry_model import JobOutcome, RetryState
from dstack_plan.watch.superseded import Superseded, log_superseded
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)

GIVEN_UP = frozenset({"job_failed", "retry_limit_exceeded"})
"""Termination reasons of a run the retry policy will not resubmit."""


class PendingRuns:
    """Queued and scheduled runs, as an actor of the loop."""

    name = "pending"

    def __init__(self) -> None:
        self._active: dict[str, str] = {}
        """Job id -> fleet of the jobs active at the end of the last tick: a job that ended
        since (even one whose end someone else committed) freed room on its fleet."""

    async def act(self, tick: Tick) -> Acted:
        freed = self._freed(tick)
        changed: dict[str, ResourceState] = {}
        resubmitted = 0
        queued = sorted(_queued(tick.state), key=lambda item: item[1].since)
        for run, record in queued:
            try:
                updated = await self._place(tick, run, record, freed)
            except Superseded as e:
                log_superseded(e)
                continue
            except DstackPlanError as e:
                log.warning("%s: placing the queued run failed: %s", run.address, e)
                continue
            if updated is not None:
                changed[run.address] = updated
                resubmitted += QUEUED_KEY not in updated.attributes and updated.status != "failed"
        for run in tick.state.resources.values():
            if run.address in changed or run.kind not in RUN_KINDS or run.tainted:
                continue
            try:
                updated = await self._scheduled(tick, run)
            except Superseded as e:
                log_superseded(e)
                continue
            except DstackPlanError as e:
                log.warning("%s: starting the scheduled run failed: %s", run.address, e)
                continue
            if updated is not None:
                changed[run.address] = updated
        self._active = _active_jobs(
            tick.state.model_copy(update={"resources": {**tick.state.resources, **changed}})
        )
        return Acted(changed=changed, resubmitted=resubmitted)

    def _freed(self, tick: Tick) -> set[str]:
        """Fleets where a job that was active (at the last tick, or as this tick read the
        state) is no longer."""
        before = {**_active_jobs(tick.read), **self._active}
        now = _active_jobs(tick.state)
        return {fleet for job, fleet in before.items() if job not in now}

    async def _place(
        self, tick: Tick, run: ResourceState, queued: Queued, freed: set[str]
    ) -> ResourceState | None:
        """Place a queued run when its backoff is over or room freed; the updated entry."""
        spec = _spec(run)
        fleet = RunRecord.of(run).fleet
        state = RetryState.from_json(run.attributes.get(RETRY_KEY))
        unplaced = [JobOutcome.unplaced(r, n, queued.last_attempt) for r, n in _slots(spec)]
        decision = decide_retry(
            spec,
            unplaced,
            state,
            tick.now,
            submitted_at=queued.since,
            capacity_freed_at=tick.now if fleet in freed else None,
        )
        origin = state.last_failure_at if state.last_failure_at is not None else queued.since
        retry = spec.retry
        reason: str | None = None
        message = decision.message
        if decision.action == "fail":
            reason = decision.reason or "job_failed"
        elif retry is not None and tick.now - origin > retry.duration:
            # the duration is over now: no point in one more attempt before saying so
            reason = "retry_limit_exceeded"
            message = f"no host had room within the retry duration of {retry.duration}s"
        if reason is not None:
            _log(run, "queued_run_failed", f"gives up: {message}")
            attributes = {k: v for k, v in run.attributes.items() if k != QUEUED_KEY} | {
                "termination_reason": reason,
                RETRY_KEY: decision.state.to_json(),
            }
            return run.updated(
                now=timestamp(tick.project.clock), status="failed", attributes=attributes
            )
        if decision.action == "wait":
            attributes = {**run.attributes, RETRY_KEY: decision.state.to_json()}
            if attributes == run.attributes:
                return None
            return run.updated(now=run.updated_at, attributes=attributes)
        if decision.action != "resubmit":
            return None
        ctx = tick.project.context(tick.state)
        try:
            hold_for_quota(tick.project.directory, tick.state, run, tick.now, tick.project.imports)
            placed = await restart_run(tick.project, run, ctx, read=tick.read)
        except NoCapacity as e:  # or QuotaHold: over a quota, it waits as for room
            attempts = decision.state.attempts
            waiting = decision.state.model_copy(
                update={"next_attempt_at": tick.now + backoff(attempts + 1)}
            )
            _log(run, "queued_run_waits", f"still no room (attempt {attempts}): {e.detail}")
            return queued_entry(tick.project, run, e.detail, **{RETRY_KEY: waiting.to_json()})
        _log(placed, "queued_run_placed", f"placed after {tick.now - queued.since:g}s queued")
        # placed again: the backoff ladder starts over
        fresh = decision.state.model_copy(update={"attempts": 0, "next_attempt_at": None})
        attributes = {**placed.attributes, RETRY_KEY: fresh.to_json()}
        return placed.updated(now=placed.updated_at, attributes=attributes)

    async def _scheduled(self, tick: Tick, run: ResourceState) -> ResourceState | None:
        """Start a due scheduled run, or put a finished one back to pending."""
        record = Scheduled.of(run.attributes)
        if record is None or run.attributes.get("termination_reason") == STOPPED_BY_USER:
            return None
        spec = _spec(run)
        now = timestamp(tick.project.clock)
        if run.status in FINISHED_STATUSES:
            if run.status == "failed" and run.attributes.get("termination_reason") not in GIVEN_UP:
                return None  # the retry policy may still resubmit it
            base = record.last_run_at or run.created_at.timestamp()
            again = Scheduled(next_run_at=next_fire(spec, base), last_run_at=record.last_run_at)
            attributes = {
                **run.attributes,
                **RunRecord.of(run).with_jobs(()).to_json(),
                SCHEDULE_KEY: again.to_json(),
            }
            for key in ("termination_reason", RETRY_KEY):
                attributes.pop(key, None)
            _log(run, "scheduled_run_ended", f"{run.status}; next run at {again.next_run_at}")
            return run.updated(now=now, status="pending", attributes=attributes)
        if run.status != "pending" or RunRecord.of(run).jobs or QUEUED_KEY in run.attributes:
            return None
        base = record.last_run_at or run.created_at.timestamp()
        if not cron_due(spec, base, tick.now):
            return None
        started = Scheduled(next_run_at=next_fire(spec, tick.now), last_run_at=tick.now)
        with_record = run.updated(
            now=run.updated_at, attributes={**run.attributes, SCHEDULE_KEY: started.to_json()}
        )
        ctx = tick.project.context(tick.state)
        try:
            hold_for_quota(
                tick.project.directory, tick.state, with_record, tick.now, tick.project.imports
            )
            placed = await restart_run(tick.project, with_record, ctx, read=tick.read)
        except NoCapacity as e:  # or QuotaHold
            if waits_for_capacity(spec):
                _log(run, "scheduled_run_queued", f"cron fired, no room: queued ({e.detail})")
                return queued_entry(tick.project, with_record, e.detail)
            _log(run, "scheduled_run_skipped", f"cron fired, no room, skipped: {e.detail}")
            return with_record.updated(now=now, attributes=with_record.attributes)
        _log(placed, "scheduled_run_started", "cron fired: started")
        return placed


def _queued(state: State) -> list[tuple[ResourceState, Queued]]:
    found = []
    for run in state.resources.values():
        if run.kind not in RUN_KINDS or run.tainted or run.status != "pending":
            continue
        queued = Queued.of(run.attributes)
        if queued is not None and not RunRecord.of(run).jobs:
            found.append((run, queued))
    return found


def _active_jobs(state: State) -> dict[str, str]:
    active = {}
    for run in state.resources.values():
        if run.kind not in RUN_KINDS:
            continue
        record = RunRecord.of(run)
        for job in record.jobs:
            if job.status not in FINISHED_STATUSES:
                active[job.id] = record.fleet
    return active


def _spec(run: ResourceState) -> RunSpec:
    spec = spec_from_normalized(run.kind, run.spec)
    assert isinstance(spec, RunSpec)
    return spec


def _slots(spec: RunSpec) -> list[tuple[int, int]]:
    from dstack_plan.runs.jobs import slots

    return [(s.replica, s.node) for s in slots(spec)]


def _log(run: ResourceState, event: str, message: str) -> None:
    log.info(
        "%s: %s",
        run.address,
        message,
        extra={
            "event": event,
            "address": run.address,
            "resource_type": "run",
            "span_id": run_span_id(run),
        },
    )
