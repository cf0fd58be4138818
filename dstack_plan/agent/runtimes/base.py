"""The contract between the job manager and a runtime."""

from __future__ import annotations

from typing import Any, Protocol

from dstack_plan.agent.job import Job, StopRequest
from dstack_plan.agent.protocol import EXECUTOR_ERROR


class StartError(Exception):
    """The workload could not be started; the job fails with `reason` and this message."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


class JobControl(Protocol):
    """What a runtime may tell the manager while it runs a job (the manager implements it)."""

    def set_status(self, job: Job, status: str) -> None:
        """Move a not-yet-started job to `status` (e.g. pulling)."""

    def set_handles(self, job: Job, **handles: Any) -> StopRequest | None:
        """Record runtime handles (container id...); returns a stop that arrived meanwhile."""

    def mark_started(self, job: Job, **handles: Any) -> StopRequest | None:
        """The workload runs now; returns a stop that arrived before, to be carried out."""

    def append_log(
        self, job: Job, data: bytes, cursor: str | None = None, stream: str = "out"
    ) -> None:
        """Add output of `stream` ("out", "err") to the job's log, secret values masked."""


def host_network_ports(job: Job) -> list[dict[str, Any]]:
    """Where a job on the host network listens: on its own ports, on the host itself."""
    return [
        {"container_port": p.container_port, "host_port": p.container_port, "host_ip": None}
        for p in job.spec.ports
    ]


class Runtime:
    """Runs jobs of one kind. Every method is called from a job's own thread or a helper."""

    name = ""

    def run(self, job: Job, ctl: JobControl) -> int:
        """Start the workload and capture its output until it exits; return its exit code.

        Raises StartError when it cannot start. If the job was finished meanwhile (stopped
        before it started), clean up and return any code: the manager ignores it.
        """
        raise NotImplementedError

    def adopt(self, job: Job, ctl: JobControl) -> int:
        """After an agent restart, re-attach to a job's workload and wait for it as `run` does."""
        raise StartError(EXECUTOR_ERROR, "agent restarted while the job was running")

    def stop(self, job: Job, timeout: float) -> None:
        """Ask the workload to stop (SIGTERM), killing it after `timeout` seconds."""
        raise NotImplementedError

    def kill(self, job: Job) -> None:
        """Kill the workload now."""
        self.stop(job, 0)

    def session_target(self, job: Job) -> dict[str, Any]:
        """Where an SSH session into the running job goes (`ssh_session.py`'s SESSION.json
        without the host's programs): `runtime`, `working_dir` and what the runtime needs."""
        raise StartError(EXECUTOR_ERROR, f"the {self.name} runtime cannot open SSH sessions")

    def cleanup(self, job: Job) -> None:
        """Release what the finished job left behind (containers...)."""

    def shutdown(self, job: Job) -> None:
        """The agent is stopping: leave the job running if it can be re-adopted, else end it."""
