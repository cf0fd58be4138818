"""The built-in `local` provider: one machine, this one, with an agent started on demand.

When a project declares no fleet, its runs go to the implicit fleet `local` on this machine.
The agent is reached directly on 127.0.0.1 (no SSH), and keeps running after the CLI exits so
jobs outlive it.

Reading needs no agent when none runs and its data dir holds no job records: then no job
exists on this machine, so a plan or `ps` gets "no jobs" and host facts gathered in-process
(see `LocalAgentClient`). Anything else starts it: a submit, or a read while job records exist
(after a reboot or a crash of the agent its containers may still run, and only the agent can
say), and the provider remembers that it did (`started`) so the CLI can say so.

A running agent is reused only when it answers `/health` within a few seconds (`health_wait`:
longer while it may still be starting). One that runs but does not answer (stopped, or hung)
is stopped (SIGTERM and SIGCONT, SIGKILL if need be) and another started in its place, as any
restart of the agent: its containers are re-adopted, its process jobs end `executor_error`. A
warning says so (`replaced_pid` records it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstack_plan.agent.api_models import ConnectionInfo, HostFacts, JobInfo, JobStatus
from dstack_plan.agent.client import AgentClient, health_wait
from dstack_plan.agent.datadir import default_agent_dir
from dstack_plan.agent.deferred_client import DeferredAgentClient
from dstack_plan.agent.protocol import HUNG_STOP_TIMEOUT
from dstack_plan.errors import AgentError, ProviderError
from dstack_plan.providers.base import GPU, Instance, MachineResources, Offer, Provider
from dstack_plan.providers.matching import static_mismatch

if TYPE_CHECKING:
    from dstack_plan.agent.http import Response
    from dstack_plan.config.resources import ResourcesSpec

log = logging.getLogger(__name__)

LOCAL_FLEET = "local"
LOCAL_PROVIDER = "local"
AGENT_START_TIMEOUT = 15.0


def resources_from_facts(facts: HostFacts) -> MachineResources:
    """What a machine has, from the host facts its agent (or this process) gathered."""
    arm = facts.arch.lower() in ("aarch64", "arm64")
    return MachineResources(
        cpus=facts.cpus,
        cpu_arch="arm" if arm else "x86",
        memory_gb=round(facts.memory.total_bytes / 2**30, 1),
        disk_gb=round(facts.disk.total_bytes / 2**30, 1),
        gpus=tuple(
            GPU(vendor=g.vendor, name=g.name, memory_mib=g.memory_mib, index=g.index)
            for g in facts.gpus
        ),
    )


class LocalProvider(Provider):
    """This machine as the one instance of the implicit fleet `local`."""

    name = LOCAL_PROVIDER

    def __init__(self, agent_dir: str | Path | None = None):
        self.agent_dir = Path(agent_dir) if agent_dir else default_agent_dir()
        self._client: LocalAgentClient | None = None
        self.started: ConnectionInfo | None = None
        """The agent this provider started (None: it started none)."""
        self.replaced_pid: int | None = None
        """The pid of the agent that was running but did not answer, which this provider
        stopped before starting another (None: it found none such)."""

    def implicit_instances(self, fleet: str) -> list[Instance]:
        """This machine, for the implicit fleet `local` (partial: `refresh` adds resources)."""
        return [self._this_machine()] if fleet == LOCAL_FLEET else []

    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        """This machine, free, unless `requirements` could never fit it (its host facts:
        gathered in-process, or from the agent if it runs; well under a second)."""
        resources = resources_from_facts(await self._facts())
        if requirements is not None and static_mismatch(requirements, resources) is not None:
            return []
        return [
            Offer(
                provider=self.name,
                instance_type=f"local ({platform.machine()})",
                region="local",
                resources=resources,
                price_per_hour=0.0,
                availability="idle",
            )
        ]

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        """Refused at once: there is one machine, this one, and it already exists."""
        raise ProviderError(self.name, "the local provider has exactly one machine: this one")

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        """Those of `instances` that are this machine, with its resources now (host facts,
        as `offers`); any other (a state moved from another machine) no longer exists here."""
        mine = [i for i in instances if i.provider == self.name and i.id == _machine_id()]
        if not mine:
            return []
        resources = resources_from_facts(await self._facts())
        return [i.model_copy(update={"resources": resources}) for i in mine]

    async def terminate(self, instances: Sequence[Instance]) -> None:
        """Returns at once: this machine is not ours to terminate."""
        return None

    async def agent(self, instance: Instance) -> AgentClient:
        """The agent on this machine (every local instance is this machine): see `client`."""
        return self.client()

    def client(self) -> AgentClient:
        """The agent on this machine, started when a request needs it (see module doc).

        No I/O; the same client until `close`."""
        if self._client is None:
            self._client = LocalAgentClient(self)
        return self._client

    async def _facts(self) -> HostFacts:
        return await self.client().host_facts()

    def _this_machine(self) -> Instance:
        return Instance(
            provider=self.name,
            id=_machine_id(),
            name=f"{LOCAL_FLEET}-0",
            fleet=LOCAL_FLEET,
            hostname=socket.gethostname(),
        )

    def idle(self) -> bool:
        """No agent runs here and none ever left a job record: no job exists on this machine."""
        from dstack_plan.agent.datadir import DataDir
        from dstack_plan.agent.liveness import is_running

        data = DataDir(self.agent_dir)
        return not is_running(data) and not _has_entries(data.jobs)

    async def open_agent(self) -> AgentClient:
        """A client of the agent: the running one when it answers `/health` (within
        `health_wait`), else one started now; one that runs but does not answer is stopped
        first (see module doc)."""
        info = await asyncio.to_thread(_running_info, self.agent_dir)
        if info is None:
            return await asyncio.to_thread(self.start_agent)
        started = info.get("started_at")
        # the agent's own wall clock (time.time) said when it started: compare with the same
        age = time.time() - started if isinstance(started, (int, float)) else None
        wait = health_wait(age, AGENT_START_TIMEOUT)
        try:
            probe = _client(self.agent_dir, timeout=wait, retries=0)
        except AgentError:  # it stopped meanwhile
            return await asyncio.to_thread(self.start_agent)
        if await probe.answers(wait):
            return _client(self.agent_dir)
        pid = int(info["pid"])
        await asyncio.to_thread(self._stop_hung, pid)
        client = await asyncio.to_thread(self.start_agent)
        self.replaced_pid = pid
        log.warning(
            "localhost: agent (pid %d) did not answer within %gs; restarted it",
            pid,
            round(wait, 1),
        )
        return client

    def _stop_hung(self, pid: int) -> None:
        from dstack_plan.agent.daemon import DaemonError, stop
        from dstack_plan.agent.datadir import DataDir

        try:
            stop(DataDir(self.agent_dir), HUNG_STOP_TIMEOUT, pid)
        except (DaemonError, OSError) as e:
            raise AgentError(
                "localhost", f"cannot stop the local agent (pid {pid}), which does not answer: {e}"
            ) from None

    def start_agent(self) -> AgentClient:
        """A client of the agent `agent start` started, or found running (blocking; no
        `/health` check of one found running: `open_agent` makes it)."""
        from dstack_plan.agent.daemon import DaemonError, start
        from dstack_plan.agent.datadir import DataDir
        from dstack_plan.agent.protocol import DEFAULT_LOG_MAX_BYTES

        try:
            info = start(DataDir(self.agent_dir), 0, DEFAULT_LOG_MAX_BYTES, AGENT_START_TIMEOUT)
        except (DaemonError, OSError) as e:
            raise AgentError("localhost", f"cannot start the local agent: {e}") from None
        if not info.get("already_running"):
            fields = {k: v for k, v in info.items() if k != "already_running"}
            self.started = ConnectionInfo.model_validate(fields)
        return _client(self.agent_dir)

    def facts_without_agent(self) -> HostFacts:
        """This machine's facts gathered in-process, as the agent would report them with no
        job running (so no GPU allocated). Docker is not asked: only the agent uses it."""
        from dstack_plan.agent.gpus import detect_gpus
        from dstack_plan.agent.hostfacts import host_facts

        disk_of = self.agent_dir
        while not disk_of.exists() and disk_of != disk_of.parent:
            disk_of = disk_of.parent  # the data dir's file system, before the dir exists
        facts: dict[str, Any] = host_facts(disk_of)
        facts["disk"]["path"] = str(self.agent_dir)
        facts["gpus"] = detect_gpus()
        facts["docker"] = {"present": False, "error": "not asked: the local agent is not running"}
        return HostFacts.model_validate(facts)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class LocalAgentClient(DeferredAgentClient):
    """The local agent as a client that starts it only when a request needs it.

    While `LocalProvider.idle()` holds, reads answer from what that means (no jobs; host
    facts gathered in-process); every other request connects first, starting the agent when
    none runs. Once connected, everything goes to the agent.
    """

    def __init__(self, provider: LocalProvider):
        super().__init__(host="localhost")
        self._provider = provider

    async def _open(self) -> AgentClient:
        return await self._provider.open_agent()

    async def _idle(self) -> bool:
        return self._agent is None and await asyncio.to_thread(self._provider.idle)

    async def host_facts(self) -> HostFacts:
        if await self._idle():
            return await asyncio.to_thread(self._provider.facts_without_agent)
        return await super().host_facts()

    async def list_jobs(
        self, status: JobStatus | str | None = None, run_name: str | None = None
    ) -> list[JobInfo]:
        if await self._idle():
            return []
        return await super().list_jobs(status, run_name)

    async def get_job(self, job_id: str, wait: int = 0) -> JobInfo:
        if await self._idle():  # what the agent answers for a job it does not know
            raise AgentError(self.host, f"no job with id {job_id!r}", 404)
        return await super().get_job(job_id, wait)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Response:
        agent = await self._connected()
        try:
            return await agent._request(method, path, **kwargs)
        except AgentError as e:
            if e.status is None:  # not reached: it died (or restarted on a new port)
                async with self._lock:  # the next request finds it again, or starts it
                    if self._agent is agent:
                        self._agent = None
            raise

    async def aclose(self) -> None:
        if self._agent is not None:
            await self._agent.aclose()


def _machine_id() -> str:
    return f"local:{socket.gethostname()}"


def _has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is not None
    except FileNotFoundError:
        return False


def _running_info(agent_dir: Path) -> dict[str, Any] | None:
    """The connection info of the agent already serving `agent_dir`, or None (then `start`
    it).

    Checked without importing the daemon and its runtimes, which would cost more than the
    rest of a small `dstack plan`.
    """
    from dstack_plan.agent.datadir import DataDir
    from dstack_plan.agent.liveness import connection_info

    return connection_info(DataDir(agent_dir))


def _client(agent_dir: Path, **kwargs: Any) -> AgentClient:
    """A client of the agent serving `agent_dir` (it listens on 127.0.0.1)."""
    return AgentClient.from_data_dir(agent_dir, host="localhost", **kwargs)
