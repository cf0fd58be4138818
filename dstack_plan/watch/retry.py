"""Whether, what and when watch resubmits after jobs of a run failed (pure: time comes in).

dstack's rules (reference §3.1, §3.3):
- a failure is retried only if the run has `retry`, its event (`no-capacity`, `interruption`,
  `error`) is in `on_events`, and the retry duration is not exceeded (exceeded: the run fails
  with `retry_limit_exceeded`; not retryable: it fails with `job_failed`);
- the duration clock: for `no-capacity` of a run that never got placed, the run's age (since
  its submission); otherwise the time since the last failure of a job that had been placed. So
  a job that keeps erroring after it ran is retried every time; what `duration` bounds is how
  long watch keeps trying to get a failed run placed again. Exceeded means strictly longer;
- a task (all its nodes: a multi-node task restarts as a whole) or a dev environment goes back
  to pending and is placed again after a backoff of 15 s, 30 s, 1 min, 2 min, 5 min, then every
  10 min (the step resets once the run is placed again); a failed service replica is
  resubmitted alone, at once, while other replicas keep running (when none is left, the whole
  service goes pending like a task);
- a run stopped by the user (`dstack stop`: jobs terminated or aborted by user) is never
  retried; nor is a job stopped by a limit (`max_duration`, inactivity, utilization), nor one
  stopped by watch (`terminated_by_server`, `scaled_down`);
- a job `preempted` (stopped to give its capacity back) ends `terminated`, yet it is an
  `interruption`: covered, it restarts as a failure does (its run waits `pending`, not
  `failed`); not covered, the run ends `terminated` with the reason `preempted` (not
  `job_failed`), and its jobs still running are stopped with it.

Times are epoch seconds. The decision carries the `RetryState` to store for the next tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from dstack_plan.agent import protocol as p
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.watch.retry_model import (
    EVENT_OF_REASON,
    INSTANCE_UNREACHABLE,
    INTERRUPTED,
    NO_CAPACITY,
    PREEMPTED,
    USER_STOPS,
    JobOutcome,
    RetryDecision,
    RetryState,
    Slot,
)

__all__ = [
    "EVENT_OF_REASON",
    "INSTANCE_UNREACHABLE",
    "INTERRUPTED",
    "NO_CAPACITY",
    "PREEMPTED",
    "USER_STOPS",
    "JobOutcome",
    "RetryDecision",
    "RetryState",
    "Slot",
    "backoff",
    "decide_retry",
]


def backoff(attempt: int) -> float:
    """Seconds a pending run waits before its `attempt`-th placement (1-based): 15 s, 30 s,
    1 min, 2 min, 5 min, then every 10 min."""
    steps = (15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
    return steps[min(max(attempt, 1), len(steps)) - 1]


def decide_retry(
    spec: RunSpec,
    jobs: Sequence[JobOutcome],
    state: RetryState,
    now: float,
    *,
    submitted_at: float,
    capacity_freed_at: float | None = None,
    stopped_by_user: bool | None = None,
) -> RetryDecision:
    """What to do about `jobs` (the latest job of each slot of a run, failed ones included
    until they are replaced), given what was decided before (`state`).

    `submitted_at`: when the run was submitted (for a scheduled run, its trigger time): the
    no-capacity clock. `capacity_freed_at`: when a host last gained room; a run waiting for
    capacity is placed at once after that instead of waiting out its backoff.
    `stopped_by_user`: whether the user stopped the run, when the caller knows; else it is
    read from the jobs (see `_stopped_by_user`).
    """
    if _stopped_by_user(jobs) if stopped_by_user is None else stopped_by_user:
        return RetryDecision(action="none", state=state, message="stopped by the user")
    failed = [j for j in jobs if j.failed]
    if not failed:
        if any(j.active and j.job_id is not None for j in jobs):
            # placed again: the backoff ladder starts over (dstack resets it on provisioning)
            state = state.model_copy(update={"attempts": 0, "first_failure_at": None})
        return RetryDecision(
            action="none", state=state.model_copy(update={"next_attempt_at": None})
        )

    first = min(failed, key=_ended)
    last_placed = max((_ended(j, now) for j in failed if j.job_id is not None), default=None)
    if state.last_failure_at is not None and (
        last_placed is None or last_placed < state.last_failure_at
    ):
        last_placed = state.last_failure_at
    state = state.model_copy(
        update={
            "first_failure_at": _ended(first, now)
            if state.first_failure_at is None
            else state.first_failure_at,
            "last_failure_at": last_placed,
            "last_reason": first.reason,
            "last_event": first.event,
        }
    )
    for job in failed:
        verdict = _verdict(spec, job, state, now, submitted_at)
        if verdict is not None:
            reason, message = verdict
            if job.preempted and reason == "job_failed":
                # not a failure of its own: the run ends `terminated`, and as one
                active = (j.job_id for j in jobs if j.active and j.job_id is not None)
                return RetryDecision(
                    action="fail",
                    state=state,
                    reason="preempted",
                    event=job.event,
                    message=message,
                    stop=tuple(sorted(active)),
                    preempted=True,
                )
            return RetryDecision(
                action="fail", state=state, reason=reason, event=job.event, message=message
            )

    units = _units(spec, jobs)
    failed_units = {u for u, members in units.items() if any(j.failed for j in members)}
    retry_slots = tuple(sorted(j.slot for u in failed_units for j in units[u]))
    stop = tuple(sorted(j.job_id for u in failed_units for j in units[u] if j.active and j.job_id))
    others_up = any(
        j.active for u, members in units.items() if u not in failed_units for j in members
    )
    what = _describe(first)
    if others_up:  # only a service has other units: its other replicas
        return RetryDecision(
            action="resubmit",
            state=state,
            slots=retry_slots,
            stop=stop,
            event=first.event,
            message=f"{what}: resubmitting replica(s) {_replicas(retry_slots)} alone",
            preempted=first.preempted,
        )
    last_ended = max(_ended(j, now) for j in failed)
    when = last_ended + backoff(state.attempts + 1)
    woken = (
        first.event == "no-capacity"
        and capacity_freed_at is not None
        and capacity_freed_at > last_ended
    )
    if woken and capacity_freed_at is not None:
        when = min(when, capacity_freed_at)
    if now < when:
        return RetryDecision(
            action="wait",
            state=state.model_copy(update={"next_attempt_at": when}),
            whole_run=True,
            slots=retry_slots,
            stop=stop,
            at=when,
            event=first.event,
            message=f"{what}: retrying in {when - now:g}s (attempt {state.attempts + 1})",
            preempted=first.preempted,
        )
    return RetryDecision(
        action="resubmit",
        state=state.model_copy(update={"attempts": state.attempts + 1, "next_attempt_at": None}),
        whole_run=True,
        slots=retry_slots,
        stop=stop,
        event=first.event,
        message=f"{what}: resubmitting the run (attempt {state.attempts + 1})",
        preempted=first.preempted,
    )


def _verdict(
    spec: RunSpec, job: JobOutcome, state: RetryState, now: float, submitted_at: float
) -> tuple[Literal["job_failed", "retry_limit_exceeded"], str] | None:
    """Why a failed job ends its run, or None when it may be retried."""
    what = _describe(job)
    retry = spec.retry
    if retry is None:
        return "job_failed", f"{what} (no retry configured)"
    if job.event not in retry.on_events:
        return "job_failed", f"{what} (retry is not on {job.event})"
    ended = _ended(job, now)
    if job.job_id is not None:
        return None  # it had been placed: its own failure starts the clock, so ~0 has passed
    since = state.last_failure_at if state.last_failure_at is not None else submitted_at
    clock = ended - since
    if clock > retry.duration:
        origin = "the last failure" if state.last_failure_at is not None else "submission"
        return (
            "retry_limit_exceeded",
            f"{what}: retry duration of {retry.duration}s exceeded ({clock:g}s since {origin})",
        )
    return None


def _stopped_by_user(jobs: Sequence[JobOutcome]) -> bool:
    """A user stop came first. The agent gives every stop through its API the reason
    `terminated_by_user` (or `aborted_by_user`), watch's too: a job stopped after a failure
    (the other nodes of a failed multi-node task) was stopped because of it."""
    stops = [_ended(j, float("inf")) for j in jobs if j.user_stopped]
    if not stops:
        return False
    failures = [_ended(j, float("inf")) for j in jobs if j.failed]
    return not failures or min(stops) <= min(failures)


def _units(spec: RunSpec, jobs: Sequence[JobOutcome]) -> dict[int, list[JobOutcome]]:
    """What restarts together: a service's replica; every job of any other run."""
    units: dict[int, list[JobOutcome]] = {}
    for job in jobs:
        units.setdefault(job.replica if isinstance(spec, ServiceSpec) else 0, []).append(job)
    return units


def _ended(job: JobOutcome, default: float = 0.0) -> float:
    return job.ended_at if job.ended_at is not None else default


def _describe(job: JobOutcome) -> str:
    where = f"replica {job.replica} node {job.node}"
    if job.reason == p.CONTAINER_EXITED_WITH_ERROR or (job.reason is None and job.exit_code):
        return f"{where} exited with code {job.exit_code} ({job.event})"
    if job.preempted:
        return f"{where} was preempted ({job.event})"
    return f"{where} failed: {job.reason or 'unknown reason'} ({job.event})"


def _replicas(slots: Sequence[Slot]) -> str:
    return ", ".join(str(r) for r in sorted({r for r, _ in slots}))
