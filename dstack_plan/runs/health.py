"""A run's status from its jobs, and whether a long-running run broke by itself (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from dstack_plan.agent.api_models import JobInfo, JobStatus, TerminationReason
from dstack_plan.plan.kinds import LONG_RUNNING_KINDS
from dstack_plan.plan.model import Crash
from dstack_plan.runs.records import JobRecord

_ACTIVE = frozenset({JobStatus.RUNNING, JobStatus.PULLING})
_USER_STOPS = (TerminationReason.TERMINATED_BY_USER, TerminationReason.ABORTED_BY_USER)


def run_status(jobs: Sequence[JobInfo]) -> str:
    """A run's status from its jobs' (dstack's derivation, simplified for one host).

    A failed job fails its run, even while other replicas or nodes still run: dstack
    terminates such a run (retries, when configured, are watch's job). `ps` and the plan show
    the run as failed, and the plan replaces a failed service or dev environment.
    """
    statuses = {j.status for j in jobs}
    if not jobs:
        return "terminated"
    if JobStatus.FAILED in statuses:
        return "failed"
    if statuses & _ACTIVE:
        return "running"
    if JobStatus.SUBMITTED in statuses:
        return "submitted"
    if JobStatus.TERMINATING in statuses:
        return "terminating"
    if statuses == {JobStatus.DONE}:
        return "done"
    return "terminated"


def crash(kind: str, run_name: str, found: Sequence[tuple[JobRecord, JobInfo]]) -> Crash | None:
    """How a service or dev environment broke by itself: a job of it failed and the user
    stopped none (`dstack stop` ends jobs as terminated/aborted by user: that stays stopped).
    Tasks are meant to finish: a failed task is a result, not drift."""
    if kind not in LONG_RUNNING_KINDS:
        return None
    if any(info.termination_reason in _USER_STOPS for _, info in found):
        return None
    failed = [(r, info) for r, info in found if info.status is JobStatus.FAILED]
    if not failed:
        return None
    record, info = failed[0]
    job = f"job {run_name}-{record.replica}-{record.node}"
    if info.termination_reason is TerminationReason.CONTAINER_EXITED_WITH_ERROR:
        what = f"{job} {info.termination_message or f'exited with code {info.exit_code}'}"
    else:
        detail = info.termination_message or (
            info.termination_reason.value if info.termination_reason else "unknown reason"
        )
        what = f"{job} failed: {detail}"
    if len(failed) > 1:
        what += f", and {len(failed) - 1} more"
    active = any(not info.finished for _, info in found)
    return Crash(f"{kind} crashed ({what})", active=active)
