"""The built-in `local` provider: one machine, this one, with an agent started on demand.

When a project declares no fleet, its runs go to the implicit fleet `local` on this machine.
The agent is reached directly on 127.0.0.1 (no SSH), and keeps running after the CLI exits so
jobs outlive it.
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
from collections.abc import Sequence
from pathlib import Path

from dstack_plan.agent.api_models import HostFacts
from dstack_plan.agent.client import AgentClient
from dstack_plan.errors import AgentError, ProviderError
from dstack_plan.providers.base import GPU, Instance, MachineResources, Offer, Provider

LOCAL_FLEET = "local"
AGENT_DIR_ENV = "DSTACK_PLAN_AGENT_DIR"
AGENT_START_TIMEOUT = 15.0


def default_agent_dir() -> Path:
    """Where this machine's agent keeps its data: `$DSTACK_PLAN_AGENT_DIR` or per user."""
    configured = os.environ.get(AGENT_DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "dstack-plan" / "agent"


def resources_from_facts(facts: HostFacts) -> MachineResources:
    arch = "arm" if facts.arch.lower() in ("aarch64", "arm64") else "x86"
    return MachineResources(
        cpus=facts.cpus,
        cpu_arch=arch,
        memory_gb=round(facts.memory.total_bytes / 2**30, 1),
        disk_gb=round(facts.disk.total_bytes / 2**30, 1),
        gpus=tuple(
            GPU(vendor=g.vendor, name=g.name, memory_mib=g.memory_mib, index=g.index)
            for g in facts.gpus
        ),
    )


class LocalProvider(Provider):
    name = "local"

    def __init__(self, agent_dir: str | Path | None = None):
        self.agent_dir = Path(agent_dir) if agent_dir else default_agent_dir()
        self._client: AgentClient | None = None
        self._lock = asyncio.Lock()

    async def _facts(self) -> HostFacts:
        client = await self.agent()
        return await client.host_facts()

    def instance(self, resources: MachineResources) -> Instance:
        return Instance(
            provider=self.name,
            id=f"local:{socket.gethostname()}",
            name=f"{LOCAL_FLEET}-0",
            fleet=LOCAL_FLEET,
            hostname=socket.gethostname(),
            resources=resources,
        )

    async def local_instance(self) -> tuple[Instance, int]:
        """This machine as an instance, and how many of its GPUs are free now."""
        facts = await self._facts()
        free = len(facts.gpus) - len(facts.gpus_allocated)
        return self.instance(resources_from_facts(facts)), free

    async def offers(self) -> list[Offer]:
        instance, _ = await self.local_instance()
        return [
            Offer(
                provider=self.name,
                instance_type=f"local ({platform.machine()})",
                region="local",
                resources=instance.resources,
                price_per_hour=0.0,
                availability="idle",
            )
        ]

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        raise ProviderError(self.name, "the local provider has exactly one machine: this one")

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        return list(instances)

    async def terminate(self, instances: Sequence[Instance]) -> None:
        return None  # this machine is not ours to terminate

    async def agent(self, instance: Instance | None = None) -> AgentClient:
        """The agent on this machine, started if it is not running."""
        async with self._lock:
            if self._client is None:
                self._client = await asyncio.to_thread(self._start_agent)
            return self._client

    def _start_agent(self) -> AgentClient:
        running = _running_agent(self.agent_dir)
        if running is not None:
            return running
        from dstack_plan.agent.daemon import DaemonError, start
        from dstack_plan.agent.datadir import DataDir
        from dstack_plan.agent.protocol import DEFAULT_LOG_MAX_BYTES

        try:
            start(DataDir(self.agent_dir), 0, DEFAULT_LOG_MAX_BYTES, AGENT_START_TIMEOUT)
        except (DaemonError, OSError) as e:
            raise AgentError("localhost", f"cannot start the local agent: {e}") from None
        return _client(self.agent_dir)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _running_agent(agent_dir: Path) -> AgentClient | None:
    """A client for the agent already serving `agent_dir`, or None (then `start` it).

    Checked without importing the daemon and its runtimes, which would cost more than the
    rest of a small `dstack plan`.
    """
    from dstack_plan.agent.datadir import DataDir
    from dstack_plan.agent.liveness import connection_info

    if connection_info(DataDir(agent_dir)) is None:
        return None
    try:
        return _client(agent_dir)
    except AgentError:
        return None


def _client(agent_dir: Path) -> AgentClient:
    """A client of the agent serving `agent_dir` (it listens on 127.0.0.1)."""
    return AgentClient.from_data_dir(agent_dir, host="localhost")
