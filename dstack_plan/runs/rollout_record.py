"""What a rolling update keeps in a service's state entry (`runs/rollout.py`): which spec each
job runs (`JobRecord.spec_hash`), the rollout in progress (`rollout`), and what that says."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from dstack_plan.agent.api_models import JobStatus
from dstack_plan.plan.kinds import ROLLING_FIELDS, ROLLOUT_KEY, rolling_paths
from dstack_plan.plan.model import ResourceChange
from dstack_plan.plan.planner import ROLLING_UPDATE
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.state.canonical import spec_hash
from dstack_plan.state.model import ResourceState

RUNNING = frozenset(s.value for s in (JobStatus.SUBMITTED, JobStatus.PULLING, JobStatus.RUNNING))


def active(status: str) -> bool:
    return status in RUNNING or status == JobStatus.TERMINATING.value


class Rollout(BaseModel):
    """What a rollout in progress keeps in the entry's attributes under `rollout`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    """`job_spec_hash` of the spec the replicas move to."""
    generation: int
    """The generation of the new jobs (their ids): ms since the epoch when it started."""
    started_at: float
    error: str | None = None
    """Why it stopped (a new replica ended before it ran); it stays stopped."""

    @classmethod
    def of(cls, attributes: Mapping[str, Any]) -> Rollout | None:
        raw = attributes.get(ROLLOUT_KEY)
        try:
            return cls.model_validate(raw) if isinstance(raw, dict) else None
        except ValueError:
            return None


def job_spec_hash(spec: Mapping[str, Any]) -> str:
    """A hash of what a service's job runs: the fields a rolling update changes."""
    fields = ROLLING_FIELDS["service"]
    return spec_hash({k: v for k, v in spec.items() if k in fields})


def rolls(change: ResourceChange) -> bool:
    """Whether an update of a service changes what its replicas run, or finishes a rolling
    update left unfinished (a rolling update)."""
    if change.kind != "service":
        return False
    return change.action_reason == ROLLING_UPDATE or bool(
        rolling_paths(change.kind, change.changed_paths)
    )


def hash_of(job: JobRecord, entry: ResourceState) -> str:
    return job.spec_hash or job_spec_hash(entry.spec)


def stamped(entry: ResourceState) -> ResourceState:
    """`entry` with every job record saying which spec it runs (before the spec changes)."""
    record = RunRecord.of(entry)
    jobs = [j._replace(spec_hash=hash_of(j, entry)) for j in record.jobs]
    attributes = {**entry.attributes, "jobs": [j.to_json() for j in jobs]}
    return entry.updated(now=entry.updated_at, attributes=attributes)


def outdated(entry: ResourceState) -> list[JobRecord]:
    """The jobs that still run a spec other than the entry's, by replica."""
    target = job_spec_hash(entry.spec)
    jobs = RunRecord.of(entry).jobs
    return sorted(
        (j for j in jobs if active(j.status) and hash_of(j, entry) != target),
        key=lambda j: j.slot,
    )


def in_progress(entry: ResourceState) -> bool:
    """A service with outdated replicas or a rollout record: a rollout is not over."""
    if entry.kind != "service" or entry.tainted:
        return False
    return ROLLOUT_KEY in entry.attributes or bool(outdated(entry))


def progress_note(entry: ResourceState) -> str | None:
    """`rolling out: 1/2 replicas on the new spec`, or why it stopped; None when none is."""
    if not in_progress(entry):
        return None
    rollout = Rollout.of(entry.attributes)
    if rollout is not None and rollout.error:
        return f"rollout stopped: {rollout.error}"
    target = job_spec_hash(entry.spec)
    jobs = RunRecord.of(entry).jobs
    replicas = {j.replica for j in jobs if active(j.status)}
    new = {j.replica for j in jobs if active(j.status) and hash_of(j, entry) == target}
    old = {j.replica for j in outdated(entry)}
    return f"rolling out: {len(new - old)}/{len(replicas)} replicas on the new spec"
