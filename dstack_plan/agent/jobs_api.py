"""The job half of the agent's interface: what refresh, watch, `ps`, `logs` and `stop` ask of
whatever runs a fleet's jobs.

`AgentClient` (`agent/client.py`) is the one that talks to our agent on a host; an engine
backend whose own scheduler runs the jobs (Slurm, Kubernetes: `providers/engine_jobs.py`) is
another. Code that only reads and ends jobs takes a `JobsAPI`, so it works on both; code that
needs the host itself (its facts, claims, ports, uploads) takes an `AgentClient`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from dstack_plan.agent.api_models import JobInfo, JobStatus, LogChunk


class JobsAPI(Protocol):
    """Jobs, by our job ids, wherever they run (see the module doc)."""

    host: str
    """How messages name where the jobs are (a host, or a cluster's login node)."""

    async def list_jobs(
        self, status: JobStatus | str | None = None, run_name: str | None = None
    ) -> list[JobInfo]:
        """Every job it knows (only those of `run_name` when given), oldest first."""
        ...

    async def get_job(self, job_id: str, wait: int = 0) -> JobInfo:
        """One job (AgentError 404 when unknown); `wait`: answer once it ended, or then."""
        ...

    async def stop(
        self,
        job_id: str,
        timeout: float | None = None,
        abort: bool = False,
        reason: str | None = None,
    ) -> JobInfo:
        """SIGTERM now, SIGKILL `timeout` seconds later (or at once with `abort`); returns
        without waiting for the end."""
        ...

    async def stop_and_remove(
        self,
        job_id: str,
        timeout: float | None = None,
        reason: str | None = None,
        wait: int = 10,
    ) -> tuple[JobInfo, bool]:
        """Stop, and remove once ended within `wait` seconds: (how it ended, True), or (its
        info, False) when it still runs then."""
        ...

    async def wait(self, job_id: str, timeout: float, poll_interval: float = 0.1) -> JobInfo:
        """The job once it has finished; AgentError when it has not within `timeout` s."""
        ...

    async def delete(self, job_id: str, force: bool = False) -> None:
        """Forget a finished job (`force`: end a running one first)."""
        ...

    async def logs(
        self,
        job_id: str,
        offset: int = 0,
        limit: int | None = None,
        wait: int = 0,
        since: float | None = None,
    ) -> LogChunk:
        """The job's output from `offset`."""
        ...

    async def read_all_logs(self, job_id: str, offset: int = 0) -> bytes:
        """Everything from `offset` to the output's current end."""
        ...

    def follow_logs(
        self,
        job_id: str,
        offset: int = 0,
        idle_timeout: int = 30,
        since: float | None = None,
    ) -> AsyncIterator[LogChunk]:
        """The output as it comes, until the job has ended and all of it was read."""
        ...


async def read_all_logs(api: JobsAPI, job_id: str, offset: int = 0) -> bytes:
    """Everything job `job_id` wrote from `offset` up to its output's current end, asked of
    `api` chunk by chunk (what `read_all_logs` of each `JobsAPI` does)."""
    parts = []
    while True:
        chunk = await api.logs(job_id, offset)
        parts.append(chunk.data)
        if chunk.next_offset == offset or chunk.next_offset >= (chunk.size or 0):
            return b"".join(parts)
        offset = chunk.next_offset
