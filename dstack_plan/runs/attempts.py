"""A run's earlier attempts: the jobs each resubmission by watch's retry policy replaced.

Attempt 1 is the run's first submission. When watch resubmits a run (all of it, or some
replicas of a service: `watch/restart.py`), the jobs that ended become an `Attempt`, kept in
the run's state attributes under `attempts`, oldest first, numbered one after the last; the
run's current jobs are its latest attempt, numbered one after the last kept. The jobs of a
kept attempt stay on their agents, finished, with their logs (`dstack logs --attempt N`, `ps`
and the UI's run page read them); a finished job holds no GPU and no port there.

Only the last MAX_ATTEMPTS_KEPT attempts are kept: the jobs of one that falls out are removed
from their agents then (`watch/restart.py`). Deleting the run removes every attempt's jobs
(`runs/ownership.py`). Like `RunRecord`, a record written by hand reads as far as it can.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.state.model import ResourceState

ATTEMPTS_KEY = "attempts"
"""The run's ended attempts in its attributes, oldest first."""
MAX_ATTEMPTS_KEPT = 10
"""Ended attempts kept per run (with their jobs on the agents); older ones are removed."""
_OUTCOMES = ("failed", "aborted", "terminated", "done")
"""An attempt's status from its jobs': the first of these any job has."""


@dataclass(frozen=True)
class Attempt:
    """One ended attempt of a run: its jobs as they ended."""

    attempt: int
    """1 for the run's first submission."""
    status: str
    """`failed`, `terminated` (preempted, stopped), ...: the worst of its jobs'."""
    reason: str | None
    """Why it ended: the reason of its first job with that status (`container_exited_with_
    error: exited with code 3`), None when none says."""
    ended_at: float
    """Epoch seconds: when its last job ended (when watch replaced it, if none says)."""
    jobs: tuple[JobRecord, ...]

    @property
    def hosts(self) -> list[str]:
        return sorted({j.host for j in self.jobs})

    @classmethod
    def ended(cls, number: int, jobs: Sequence[JobRecord], now: float) -> Attempt:
        """Attempt `number` made of `jobs` as they ended (`now` if none says when)."""
        statuses = [j.status for j in jobs]
        status = next((s for s in _OUTCOMES if s in statuses), statuses[0] if jobs else "unknown")
        reasons = [j.reason for j in jobs if j.status == status and j.reason]
        reasons += [j.reason for j in jobs if j.reason]
        ends = [j.finished_at for j in jobs if j.finished_at is not None]
        return cls(
            attempt=number,
            status=status,
            reason=reasons[0] if reasons else None,
            ended_at=max(ends) if ends else now,
            jobs=tuple(jobs),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "status": self.status,
            **({"reason": self.reason} if self.reason is not None else {}),
            "ended_at": self.ended_at,
            "jobs": [j.to_json() for j in self.jobs],
        }

    @classmethod
    def from_json(cls, raw: object) -> Attempt | None:
        if not isinstance(raw, dict):
            return None
        number, ended_at, jobs = raw.get("attempt"), raw.get("ended_at"), raw.get("jobs")
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            return None
        reason = raw.get("reason")
        records = jobs if isinstance(jobs, list) else []
        return cls(
            attempt=number,
            status=str(raw.get("status", "unknown")),
            reason=None if reason is None else str(reason),
            ended_at=(
                float(ended_at)
                if isinstance(ended_at, int | float) and not isinstance(ended_at, bool)
                else 0.0
            ),
            jobs=tuple(r for r in map(JobRecord.from_json, records) if r is not None),
        )


def attempts_of(attributes: Mapping[str, Any]) -> tuple[Attempt, ...]:
    """The run's ended attempts, oldest first (those that read)."""
    raw = attributes.get(ATTEMPTS_KEY)
    if not isinstance(raw, list):
        return ()
    found = (Attempt.from_json(a) for a in raw)
    return tuple(sorted((a for a in found if a is not None), key=lambda a: a.attempt))


def current_attempt(attributes: Mapping[str, Any]) -> int:
    """The number of the run's current jobs: one after its last ended attempt."""
    earlier = attempts_of(attributes)
    return earlier[-1].attempt + 1 if earlier else 1


def kept_job_ids(attributes: Mapping[str, Any]) -> set[str]:
    """The ids of the jobs of the run's ended attempts (kept on their agents)."""
    return {j.id for a in attempts_of(attributes) for j in a.jobs}


def with_ended(
    attributes: Mapping[str, Any], jobs: Sequence[JobRecord], now: float
) -> tuple[dict[str, Any], tuple[Attempt, ...]]:
    """`attributes` with `jobs` recorded as the run's next ended attempt, and the attempts
    that fell out of the MAX_ATTEMPTS_KEPT kept (their jobs are for the caller to remove)."""
    earlier = attempts_of(attributes)
    ended = Attempt.ended(current_attempt(attributes), jobs, now)
    kept = (*earlier, ended)
    dropped, kept = kept[:-MAX_ATTEMPTS_KEPT], kept[-MAX_ATTEMPTS_KEPT:]
    return with_attempts(attributes, kept), dropped


def with_attempts(attributes: Mapping[str, Any], attempts: Iterable[Attempt]) -> dict[str, Any]:
    """`attributes` with `attempts` as the run's ended attempts."""
    return {**attributes, ATTEMPTS_KEY: [a.to_json() for a in attempts]}


def attempt_jobs(run: ResourceState, number: int | None) -> tuple[JobRecord, ...]:
    """The jobs of attempt `number` of `run` (None: the latest, its current jobs).

    Raises DstackPlanError naming the attempts there are when it has no such attempt."""
    current = current_attempt(run.attributes)
    if number is None or number == current:
        return RunRecord.of(run).jobs
    for attempt in attempts_of(run.attributes):
        if attempt.attempt == number:
            return attempt.jobs
    numbers = [a.attempt for a in attempts_of(run.attributes)] + [current]
    raise DstackPlanError(
        f"{run.address} has no attempt {number} (its attempts: {spans(numbers)})"
    )


def spans(numbers: Sequence[int]) -> str:
    """`1-3, 7` for [1, 2, 3, 7] (sorted, no repeats)."""
    parts: list[str] = []
    start = prev = None
    for n in sorted(set(numbers)):
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)
