"""What Slurm says of jobs, read into our job statuses (pure: parsing and mapping only).

One listing command on the login node (`providers/slurm/engine.py`) prints the user's jobs as
`squeue` knows them (pending, running, and finished ones still in its memory: `MinJobAge`),
the nodes that are down or drained with Slurm's reason, and the job directories with the exit
code each node wrote. A job's status comes from Slurm's state; its exit code from the node
files, which outlive Slurm's memory of the job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from dstack_plan.agent.api_models import JobStatus, TerminationReason

SQUEUE_FORMAT = "%i|%T|%r|%N|%S|%e"
"""id, state, reason, nodes, start time (estimated while pending), end time."""

_ACTIVE = {
    "PENDING": JobStatus.SUBMITTED,
    "REQUEUED": JobStatus.SUBMITTED,
    "REQUEUE_HOLD": JobStatus.SUBMITTED,
    "REQUEUE_FED": JobStatus.SUBMITTED,
    "RESV_DEL_HOLD": JobStatus.SUBMITTED,
    "SUSPENDED": JobStatus.SUBMITTED,
    "CONFIGURING": JobStatus.PULLING,
    "RUNNING": JobStatus.RUNNING,
    "RESIZING": JobStatus.RUNNING,
    "SIGNALING": JobStatus.TERMINATING,
    "STAGE_OUT": JobStatus.TERMINATING,
    "COMPLETING": JobStatus.TERMINATING,
    "STOPPED": JobStatus.TERMINATING,
}
"""Slurm's states of a job that has not ended, as our job statuses."""

_ENDED: dict[str, tuple[JobStatus, TerminationReason]] = {
    "COMPLETED": (JobStatus.DONE, TerminationReason.DONE_BY_RUNNER),
    "FAILED": (JobStatus.FAILED, TerminationReason.CONTAINER_EXITED_WITH_ERROR),
    "OUT_OF_MEMORY": (JobStatus.FAILED, TerminationReason.CONTAINER_EXITED_WITH_ERROR),
    "CANCELLED": (JobStatus.TERMINATED, TerminationReason.TERMINATED_BY_USER),
    "TIMEOUT": (JobStatus.TERMINATED, TerminationReason.MAX_DURATION_EXCEEDED),
    "DEADLINE": (JobStatus.TERMINATED, TerminationReason.MAX_DURATION_EXCEEDED),
    "PREEMPTED": (JobStatus.TERMINATED, TerminationReason.PREEMPTED),
    "NODE_FAIL": (JobStatus.FAILED, TerminationReason.EXECUTOR_ERROR),
    "BOOT_FAIL": (JobStatus.FAILED, TerminationReason.EXECUTOR_ERROR),
    "SPECIAL_EXIT": (JobStatus.FAILED, TerminationReason.EXECUTOR_ERROR),
    "REVOKED": (JobStatus.TERMINATED, TerminationReason.TERMINATED_BY_SERVER),
}
"""Slurm's final states, as our job statuses and termination reasons."""


@dataclass(frozen=True)
class QueuedJob:
    """One line of `squeue -o SQUEUE_FORMAT`."""

    slurm_id: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    start: float | None
    """When it started, or (pending) when Slurm expects it to start; None: not known."""
    end: float | None

    @property
    def ended(self) -> bool:
        return self.state not in _ACTIVE


def parse_squeue(text: str) -> dict[str, QueuedJob]:
    """The jobs of `squeue -h -o SQUEUE_FORMAT` output, by Slurm job id (the last line of a
    job listed twice wins; lines of another shape are skipped)."""
    found: dict[str, QueuedJob] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6 or not parts[0]:
            continue
        slurm_id, state, reason, nodes, start, end = parts[:6]
        found[slurm_id] = QueuedJob(
            slurm_id=slurm_id,
            state=state.split()[0].rstrip("+"),
            reason="" if reason in ("None", "(null)") else reason,
            nodes=tuple(expand_hostlist(nodes)) if nodes and nodes != "(null)" else (),
            start=slurm_time(start),
            end=slurm_time(end),
        )
    return found


def parse_by_node(text: str) -> dict[str, str]:
    """Node -> value, from `sinfo -h -N ... -o '%n|VALUE'` lines: the reason an admin or
    Slurm gave a node down, drained or failing (`-R`, `%E`), or its address (`%o`)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, bar, reason = line.strip().partition("|")
        if bar and name:
            found[name] = reason.strip()
    return found


def slurm_time(text: str) -> float | None:
    """Seconds since the epoch of Slurm's local `2026-12-07T10:00:00`; None for `N/A`,
    `Unknown` and other non-times."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact node list (`gpu[1-3,7],cpu1`) as names, in Slurm's order."""
    names: list[str] = []
    for item in _split_top(text):
        prefix, bracket, rest = item.partition("[")
        if not bracket:
            names.append(item)
            continue
        body, _, suffix = rest.partition("]")
        for part in body.split(","):
            low, dash, high = part.partition("-")
            if not dash:
                names.append(f"{prefix}{low}{suffix}")
                continue
            width = len(low)
            names += [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(low), int(high) + 1)]
    return names


def _split_top(text: str) -> Iterable[str]:
    """`text` split at the commas outside brackets."""
    depth, start = 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            if index > start:
                yield text[start:index]
            start = index + 1
    if start < len(text):
        yield text[start:]


@dataclass(frozen=True)
class NodeOutcome:
    """How one node's part of a run stands."""

    status: JobStatus
    reason: TerminationReason | None = None
    message: str | None = None
    exit_code: int | None = None


def node_outcome(
    queued: QueuedJob | None,
    exit_code: int | None,
    stopped: bool,
    down: Mapping[str, str],
) -> NodeOutcome:
    """One node's status from Slurm's view of its job (`queued`; None once Slurm forgot it),
    the exit code its commands left (None: they did not end by themselves), whether we
    cancelled the job (`stopped`), and the nodes down with Slurm's reason."""
    if queued is not None and not queued.ended:
        return NodeOutcome(_ACTIVE.get(queued.state, JobStatus.RUNNING))
    if queued is not None and queued.state in ("NODE_FAIL", "BOOT_FAIL"):
        lost = [f"{n}: {down[n]}" for n in queued.nodes if n in down]
        why = "; ".join(lost) if lost else queued.reason or "a node failed"
        message = f"Slurm ended the job ({queued.state}): {why}"
        return NodeOutcome(JobStatus.FAILED, TerminationReason.EXECUTOR_ERROR, message, exit_code)
    if stopped:
        return NodeOutcome(
            JobStatus.TERMINATED, TerminationReason.TERMINATED_BY_USER, None, exit_code
        )
    if exit_code is not None:
        if exit_code == 0:
            return NodeOutcome(JobStatus.DONE, TerminationReason.DONE_BY_RUNNER, None, 0)
        return NodeOutcome(
            JobStatus.FAILED,
            TerminationReason.CONTAINER_EXITED_WITH_ERROR,
            f"exited with code {exit_code}",
            exit_code,
        )
    if queued is None:
        return NodeOutcome(
            JobStatus.FAILED,
            TerminationReason.EXECUTOR_ERROR,
            "Slurm no longer knows the job and it left no exit code",
        )
    status, reason = _ENDED.get(queued.state, (JobStatus.FAILED, TerminationReason.EXECUTOR_ERROR))
    message = f"Slurm ended the job: {queued.state}" + (
        f" ({queued.reason})" if queued.reason else ""
    )
    return NodeOutcome(status, reason, message, exit_code)
