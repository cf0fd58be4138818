"""What watch knows about a run's failed jobs, and keeps between ticks (for `watch.retry`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.agent import protocol as p
from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.profile import RetryEvent
from dstack_plan.runs.records import JobRecord

# Termination reasons watch itself gives, besides the agent's (dstack's names).
NO_CAPACITY = "failed_to_start_due_to_no_capacity"
"""The run (or a replica) could not be placed: no host had room."""
INSTANCE_UNREACHABLE = "instance_unreachable"
"""The job's host stopped answering for longer than the grace period."""
INTERRUPTED = "interrupted_by_no_capacity"
"""A spot machine was taken back."""
PREEMPTED = p.PREEMPTED
"""The agent's reason for a job stopped to give its capacity back (a fleet's owner reclaiming
borrowed GPUs): it ends `terminated`, yet it is an interruption, as a spot reclaim is."""

EVENT_OF_REASON: dict[str, RetryEvent] = {
    NO_CAPACITY: "no-capacity",
    INTERRUPTED: "interruption",
    # dstack files an unreachable host under `error`; here a host that dropped off (an SSH
    # host powered off, a machine lost) is an interruption of the job, not its own error.
    INSTANCE_UNREACHABLE: "interruption",
    # a preemption takes capacity away as a spot reclaim does: both are interruptions
    PREEMPTED: "interruption",
    p.CONTAINER_EXITED_WITH_ERROR: "error",
    p.CREATING_CONTAINER_ERROR: "error",
    p.EXECUTOR_ERROR: "error",
}
USER_STOPS = frozenset({p.TERMINATED_BY_USER, p.ABORTED_BY_USER})
_FINISHED = frozenset(p.FINISHED_STATUSES)


def preempted(reason: str | None) -> bool:
    """Whether a termination reason is a preemption: the agent's `preempted`, or a job
    record's `preempted: <message>`."""
    return reason is not None and (reason == PREEMPTED or reason.startswith(PREEMPTED + ":"))


Slot = tuple[int, int]
"""(replica, node) of a job."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobOutcome(_Frozen):
    """The latest job of one slot of a run, as watch sees it this tick."""

    job_id: str | None
    """None: never placed (no host had room)."""
    replica: int = 0
    node: int = 0
    status: str
    """The agent's job status; `unknown` while its host does not answer (not yet a failure)."""
    reason: str | None = None
    """Its termination reason: the agent's, or watch's (`NO_CAPACITY`, `INSTANCE_UNREACHABLE`)."""
    exit_code: int | None = None
    ended_at: float | None = None
    """When it ended, was found unreachable, or failed to be placed."""

    @classmethod
    def of(cls, record: JobRecord, info: JobInfo) -> JobOutcome:
        """A placed job as its agent reported it."""
        reason = info.termination_reason
        return cls(
            job_id=info.id,
            replica=record.replica,
            node=record.node,
            status=info.status.value,
            reason=None if reason is None else reason.value,
            exit_code=info.exit_code,
            ended_at=info.finished_at,
        )

    @classmethod
    def unreachable(cls, record: JobRecord, at: float) -> JobOutcome:
        """A job given up for its host: unreachable for longer than the grace period, or
        (the record's reason says so) a spot machine taken back."""
        return cls(
            job_id=record.id,
            replica=record.replica,
            node=record.node,
            status=p.FAILED,
            reason=INTERRUPTED if record.reason == INTERRUPTED else INSTANCE_UNREACHABLE,
            ended_at=at,
        )

    @classmethod
    def unplaced(cls, replica: int, node: int, at: float) -> JobOutcome:
        """A slot that could not be placed at `at` (no capacity)."""
        return cls(
            job_id=None,
            replica=replica,
            node=node,
            status=p.FAILED,
            reason=NO_CAPACITY,
            ended_at=at,
        )

    @property
    def slot(self) -> Slot:
        return (self.replica, self.node)

    @property
    def active(self) -> bool:
        return self.status not in _FINISHED

    @property
    def user_stopped(self) -> bool:
        return self.reason in USER_STOPS

    @property
    def preempted(self) -> bool:
        """Stopped to give its capacity back: ended `terminated`, yet a failure (an
        interruption) that a retry may restart."""
        return preempted(self.reason)

    @property
    def failed(self) -> bool:
        """Ended by a failure (a user's or a limit's stop is not one; a preemption is)."""
        if self.reason in EVENT_OF_REASON:
            return True
        if self.status not in _FINISHED:
            return False
        if self.reason is not None:
            return self.status == p.FAILED
        return self.status == p.FAILED or self.exit_code not in (None, 0)

    @property
    def event(self) -> RetryEvent:
        """The retry event of a failed job: a failure of no known kind is an `error`."""
        return EVENT_OF_REASON.get(self.reason or "", "error")


class RetryState(_Frozen):
    """What watch keeps per run between ticks (in the run's state attributes)."""

    attempts: int = 0
    """Placements of the whole run since it was last placed: the backoff step."""
    first_failure_at: float | None = None
    """The first failure since the run was last placed (for `ps` and events)."""
    last_failure_at: float | None = None
    """The last failure of a job that had been placed: the duration clock of interruption and
    error, and of a no-capacity that follows one."""
    next_attempt_at: float | None = None
    """When a pending run is to be placed again."""
    last_reason: str | None = None
    last_event: RetryEvent | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=True)

    @classmethod
    def from_json(cls, raw: object) -> RetryState:
        """Read back from state; a missing or hand-mangled record reads as a fresh one."""
        try:
            return cls.model_validate(raw) if isinstance(raw, dict) else cls()
        except ValidationError:
            return cls()


class RetryDecision(_Frozen):
    """What to do about a run's failures this tick."""

    action: Literal["none", "resubmit", "wait", "fail"]
    """`none`: nothing to retry (nothing failed, or the user or a limit stopped it);
    `resubmit`: place `slots` again now; `wait`: until `at`, then ask again; `fail`: the run
    ends with `reason` (`job_failed` or `retry_limit_exceeded`: `failed`; `preempted`, a
    preempted job no retry covers: `terminated`, its other active jobs in `stop`)."""
    state: RetryState
    """To store for the next tick (after acting on the decision)."""
    message: str = ""
    whole_run: bool = False
    """The run restarts as a whole (status `pending` while it waits)."""
    slots: tuple[Slot, ...] = ()
    """The slots to resubmit (or that wait to be)."""
    stop: tuple[str, ...] = ()
    """Job ids still active among them: stop these before resubmitting."""
    at: float | None = None
    reason: Literal["job_failed", "retry_limit_exceeded", "preempted"] | None = None
    event: RetryEvent | None = None
    preempted: bool = False
    """The failure acted on is a preemption (the run's first, for `wait` and `resubmit`):
    the run waits `pending`, not `failed`."""
