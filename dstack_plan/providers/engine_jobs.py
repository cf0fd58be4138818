"""An engine cluster's jobs behind the job half of the agent's interface (`agent/jobs_api.py`).

What reads and ends jobs (refresh, watch, `ps`, `logs`, `stop`, destroy) asks a Slurm or
Kubernetes cluster as it asks an agent. The differences are the engine's: an engine answers
from a poll of the cluster, never holding an answer until a job ends; a stop's SIGKILL is the
engine's, left to it (Slurm's cancel, Kubernetes' grace period); output is polled while it
grows; a job is submitted with the rest of its run (`runs/engine_runs.py`), never alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from dstack_plan.agent.api_models import JobInfo, JobSpec, JobStatus, LogChunk
from dstack_plan.agent.jobs_api import JobsAPI, read_all_logs
from dstack_plan.agent.spec import JobSpec as CheckedSpec
from dstack_plan.agent.spec import SpecError, parse_job_spec
from dstack_plan.clock import Clock
from dstack_plan.errors import AgentError, ProviderError

FOLLOW_POLL = 1.0
"""Seconds between reads of a followed job's output while it has nothing new."""
LOG_CHUNK = 1 << 20
"""Bytes of output one read returns at most."""


def checked_spec(spec: JobSpec, provider: str) -> CheckedSpec:
    """`spec` as an agent would take it: checked, its secrets known by name (so what an
    engine records of it is redacted as an agent's record is)."""
    try:
        return parse_job_spec(spec.to_wire())
    except SpecError as e:
        raise ProviderError(provider, f"job {spec.id}: {e}") from e


class JobEngine(Protocol):
    """What an engine does with the jobs it runs, by our job ids."""

    @property
    def name(self) -> str: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def unreachable(self) -> tuple[type[Exception], ...]:
        """The errors that mean the cluster could not be reached (not that a job is wrong)."""
        ...

    async def list_jobs(self, run_name: str | None = None) -> list[JobInfo]: ...

    async def get_job(self, job_id: str) -> JobInfo: ...

    async def stop(self, job_id: str, timeout: float, abort: bool = False) -> JobInfo: ...

    async def delete(self, job_id: str) -> None: ...

    async def logs(
        self, job_id: str, offset: int = 0, limit: int = LOG_CHUNK
    ) -> tuple[bytes, int, bool]:
        """Up to `limit` bytes from `offset`: (the bytes, the output's size, whether the job
        has ended)."""
        ...


class EngineJobs:
    """`JobsAPI` over one cluster's engine. A cluster that cannot be reached is an
    AgentError, as an agent that cannot be: what reads jobs concludes nothing from it."""

    def __init__(self, engine: JobEngine):
        self.engine = engine
        self.host = engine.name

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        try:
            yield
        except self.engine.unreachable as e:
            raise AgentError(self.host, f"cannot reach the cluster: {e}") from e

    async def list_jobs(
        self, status: JobStatus | str | None = None, run_name: str | None = None
    ) -> list[JobInfo]:
        with self._reaching():
            jobs = await self.engine.list_jobs(run_name=run_name)
        if status is None:
            return jobs
        return [j for j in jobs if j.status is JobStatus(status)]

    async def get_job(self, job_id: str, wait: int = 0) -> JobInfo:
        # an agent can hold its answer; a poll of the cluster is the same question later
        with self._reaching():
            return await self.engine.get_job(job_id)

    async def stop(
        self,
        job_id: str,
        timeout: float | None = None,
        abort: bool = False,
        reason: str | None = None,
    ) -> JobInfo:
        grace = timeout if timeout is not None else await self._stop_timeout(job_id)
        with self._reaching():
            return await self.engine.stop(job_id, grace, abort=abort)

    async def stop_and_remove(
        self,
        job_id: str,
        timeout: float | None = None,
        reason: str | None = None,
        wait: int = 10,
    ) -> tuple[JobInfo, bool]:
        info = await self.stop(job_id, timeout=timeout, reason=reason)
        clock = self.engine.clock
        deadline = clock.now() + wait
        while not info.finished and clock.now() < deadline:
            await clock.sleep(FOLLOW_POLL)
            info = await self.get_job(job_id)
        if not info.finished:
            return info, False
        with self._reaching():
            await self.engine.delete(job_id)
        return info, True

    async def wait(self, job_id: str, timeout: float, poll_interval: float = 0.1) -> JobInfo:
        clock = self.engine.clock
        deadline = clock.now() + timeout
        while True:
            info = await self.get_job(job_id)
            if info.finished:
                return info
            if clock.now() >= deadline:
                raise AgentError(
                    self.host, f"job {job_id} still {info.status.value} after {timeout:g}s"
                )
            await clock.sleep(max(poll_interval, FOLLOW_POLL))

    async def delete(self, job_id: str, force: bool = False) -> None:
        if not force and not (await self.get_job(job_id)).finished:
            raise AgentError(self.host, f"job {job_id} still runs: stop it first", status=409)
        with self._reaching():
            await self.engine.delete(job_id)

    async def logs(
        self,
        job_id: str,
        offset: int = 0,
        limit: int | None = None,
        wait: int = 0,
        since: float | None = None,
    ) -> LogChunk:
        with self._reaching():
            data, size, ended = await self.engine.logs(job_id, offset, limit or LOG_CHUNK)
        end = offset + len(data)
        return LogChunk(
            job_id=job_id,
            offset=offset,
            next_offset=end,
            size=size,
            complete=ended and end >= size,
            data=data,
        )

    async def read_all_logs(self, job_id: str, offset: int = 0) -> bytes:
        return await read_all_logs(self, job_id, offset)

    async def follow_logs(
        self,
        job_id: str,
        offset: int = 0,
        idle_timeout: int = 30,
        since: float | None = None,
    ) -> AsyncIterator[LogChunk]:
        position = offset
        while True:
            chunk = await self.logs(job_id, position)
            if chunk.data:
                yield chunk
                position = chunk.next_offset
                continue
            if chunk.complete:
                return
            await self.engine.clock.sleep(FOLLOW_POLL)

    async def _stop_timeout(self, job_id: str) -> float:
        return (await self.get_job(job_id)).stop_timeout


if TYPE_CHECKING:  # mypy holds EngineJobs to the protocol it serves
    _SERVES: type[JobsAPI] = EngineJobs
