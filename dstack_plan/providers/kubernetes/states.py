"""A node's status from its pod, as an agent would report its job (pure).

A Job's pod goes Pending → Running → Succeeded / Failed; its container's `terminated` state
holds the exit code. A pod the kubelet is ending (`deletionTimestamp`) is terminating. A pod
Kubernetes failed itself (a lost node, an eviction, `activeDeadlineSeconds`) is an executor
error with Kubernetes' reason. A replica's pod (a Deployment's) is restarted in place: a
container that exited is a failed replica, for watch's `retry` to replace.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dstack_plan.agent.api_models import JobStatus, TerminationReason

_PULLING = frozenset({"ContainerCreating", "PodInitializing", "ErrImagePull", "ImagePullBackOff"})
_BAD_IMAGE = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"})


@dataclass(frozen=True)
class PodOutcome:
    """One node's status, with what ended it."""

    status: JobStatus
    reason: TerminationReason | None = None
    message: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None


def pod_outcome(pod: Any | None, stopped: bool, gone: str | None = None) -> PodOutcome:
    """The status of the node `pod` runs (None: no pod for it now). `stopped`: we stopped
    the run; `gone`: why the pod will not come (its Job failed or finished without it),
    None while it may still be created."""
    if pod is None:
        if stopped:
            return PodOutcome(JobStatus.TERMINATED, TerminationReason.TERMINATED_BY_USER)
        if gone is not None:
            return PodOutcome(JobStatus.FAILED, TerminationReason.EXECUTOR_ERROR, gone)
        return PodOutcome(JobStatus.SUBMITTED)
    status = pod.status
    container = _container(pod)
    started = _time(getattr(status, "start_time", None))
    state = getattr(container, "state", None)
    terminated = getattr(state, "terminated", None)
    last = getattr(getattr(container, "last_state", None), "terminated", None)
    if terminated is None and last is not None and pod.spec.restart_policy == "Always":
        terminated = last  # a replica that exited, restarted by the kubelet: it failed
    phase = getattr(status, "phase", None) or "Pending"
    if terminated is not None or phase in ("Succeeded", "Failed"):
        code = getattr(terminated, "exit_code", None)
        ended = _time(getattr(terminated, "finished_at", None))
        if stopped:
            return PodOutcome(
                JobStatus.TERMINATED,
                TerminationReason.TERMINATED_BY_USER,
                None,
                code,
                started,
                ended,
            )
        if code is None or getattr(status, "reason", None):
            why = getattr(status, "reason", None) or "the pod failed"
            said = getattr(status, "message", None)
            message = f"Kubernetes: {why}" + (f": {said}" if said else "")
            return PodOutcome(
                JobStatus.FAILED, TerminationReason.EXECUTOR_ERROR, message, code, started, ended
            )
        if code == 0 and phase != "Running":
            return PodOutcome(
                JobStatus.DONE, TerminationReason.DONE_BY_RUNNER, None, 0, started, ended
            )
        return PodOutcome(
            JobStatus.FAILED,
            TerminationReason.CONTAINER_EXITED_WITH_ERROR,
            f"exited with code {code}",
            code,
            started,
            ended,
        )
    if pod.metadata.deletion_timestamp is not None:
        return PodOutcome(JobStatus.TERMINATING, started_at=started)
    waiting = getattr(state, "waiting", None)
    why = getattr(waiting, "reason", None)
    if why in _BAD_IMAGE:
        message = f"Kubernetes: {why}: {getattr(waiting, 'message', None) or ''}".rstrip(": ")
        return PodOutcome(JobStatus.FAILED, TerminationReason.CREATING_CONTAINER_ERROR, message)
    if phase == "Running" and getattr(state, "running", None) is not None:
        return PodOutcome(JobStatus.RUNNING, started_at=started)
    if why in _PULLING:
        return PodOutcome(JobStatus.PULLING, started_at=started)
    return PodOutcome(JobStatus.SUBMITTED)


def pending_reason(pod: Any | None) -> str | None:
    """Why the scheduler has not placed `pod` (its `PodScheduled` condition), if it said."""
    if pod is None:
        return None
    for condition in getattr(pod.status, "conditions", None) or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return str(condition.message or condition.reason or "not scheduled")
    return None


def _container(pod: Any) -> Any | None:
    statuses = getattr(pod.status, "container_statuses", None) or []
    return statuses[0] if statuses else None


def _time(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None
