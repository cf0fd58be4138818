"""The provider contract: where machines come from and how their agents are reached.

A provider offers machines, creates and terminates them, and says which still exist. It never
runs jobs: every machine it hands out runs an agent, and `agent()` returns a client for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from dstack_plan.agent.client import AgentClient


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GPU(_Frozen):
    vendor: str
    name: str
    memory_mib: int = 0
    index: int | None = None


class MachineResources(_Frozen):
    """What one machine has."""

    cpus: int
    cpu_arch: Literal["x86", "arm"] = "x86"
    memory_gb: float
    disk_gb: float
    gpus: tuple[GPU, ...] = ()

    def pretty(self) -> str:
        text = f"cpu={self.cpus} mem={self.memory_gb:g}GB disk={self.disk_gb:g}GB"
        if self.gpus:
            first = self.gpus[0]
            memory = f":{first.memory_mib // 1024}GB" if first.memory_mib else ""
            text += f" gpu={first.name}{memory}:{len(self.gpus)}"
        return text


class Offer(_Frozen):
    """A machine a provider can hand out, and at what price."""

    model_config = ConfigDict(defer_build=True)  # only cloud fleets ask for offers

    provider: str
    instance_type: str
    region: str
    resources: MachineResources
    price_per_hour: float
    spot: bool = False
    availability: Literal["available", "idle", "busy", "not_available", "no_quota", "unknown"] = (
        "available"
    )


class Instance(_Frozen):
    """A machine that exists (or is being created) in a fleet."""

    provider: str
    id: str
    name: str
    fleet: str
    hostname: str
    region: str = "local"
    resources: MachineResources
    price_per_hour: float = 0.0
    status: Literal["pending", "provisioning", "idle", "busy", "terminating", "terminated"] = (
        "idle"
    )


class Provider(ABC):
    """One source of machines. Registered under the entry-point group `dstack_plan.providers`."""

    name: ClassVar[str]

    @abstractmethod
    async def offers(self) -> list[Offer]:
        """Every kind of machine this provider can hand out now (filtered by the scheduler)."""

    @abstractmethod
    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        """Create `count` machines from `offer` for `fleet`, each running an agent."""

    @abstractmethod
    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        """The given instances as they are now; those that no longer exist are left out."""

    @abstractmethod
    async def terminate(self, instances: Sequence[Instance]) -> None:
        """Terminate machines. Idempotent: a machine already gone is fine."""

    @abstractmethod
    async def agent(self, instance: Instance) -> AgentClient:
        """A connected client for the agent on `instance`, starting the agent if needed."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (SSH tunnels, HTTP clients)."""
