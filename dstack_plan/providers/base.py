"""The provider contract: where machines come from and how their agents are reached.

A provider offers machines, creates and terminates them, and says which still exist. It never
runs jobs: every machine it hands out runs an agent, and `agent()` returns a client for it.
The contract is the minimum every provider has; volumes and gateways are capabilities a
provider opts into with the mixins of `providers/capabilities.py`.

Like dstack's `Compute`, every method says how long it may take and what it promises when it
is called again: handlers are retried after a crash, so a repeated call must be safe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from dstack_plan.agent.client import AgentClient
    from dstack_plan.config.resources import ResourcesSpec


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
    zones: tuple[str, ...] | None = None
    """The zones of its region a machine of it may be created in, in the order to try them
    (a fleet's `availability_zones`); None: any zone of the region."""


class Instance(_Frozen):
    """A machine that exists (or is being created) in a fleet."""

    provider: str
    id: str
    name: str
    fleet: str
    hostname: str
    region: str = "local"
    zone: str | None = None
    """The availability zone it runs in (a network volume attaches only there); None where
    the provider has no zones or does not say."""
    resources: MachineResources | None = None
    """None while not known: a partial instance, as `create_instances` or
    `implicit_instances` return it before `refresh` completes it."""
    price_per_hour: float = 0.0
    status: Literal["pending", "provisioning", "idle", "busy", "terminating", "terminated"] = (
        "idle"
    )


class Provider(ABC):
    """One source of machines. Registered under the entry-point group `dstack_plan.providers`.

    Constructing one does no I/O (the registry builds providers a plan may never use).
    """

    name: ClassVar[str]

    @abstractmethod
    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        """The kinds of machine this provider can hand out now that may satisfy
        `requirements` (every kind when None); the scheduler makes the final match.

        Takes as long as one round of catalogue queries (seconds; a provider may cache it).
        Read-only: calling it again changes nothing.
        """

    @abstractmethod
    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        """Start creating `count` machines from `offer` for `fleet`, each to run an agent.

        Returns as soon as the provider has accepted the request (seconds, never the minutes
        a machine takes to boot), with partial instances (`status` `pending` or
        `provisioning`, `resources` maybe None) that `refresh` completes: a handler must not
        block on a boot. Not idempotent: the caller records the returned ids at once, and
        after a crash finds what a cut-short call created with `refresh` and `terminate`.
        Raises ProviderError when the offer cannot be had (no capacity, no quota).
        """

    @abstractmethod
    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        """The given instances as they are now, completed as far as known; those that no
        longer exist are left out (drift).

        One batch of reads for all of them (seconds), no side effects: safe to repeat.
        """

    @abstractmethod
    async def terminate(self, instances: Sequence[Instance]) -> None:
        """Start terminating machines and return as soon as the provider has accepted it.

        Idempotent: a machine already gone, or already terminating, returns silently; call it
        again until `refresh` leaves the machine out.
        """

    @abstractmethod
    async def agent(self, instance: Instance) -> AgentClient:
        """A client for the agent on `instance`, connecting (and starting the agent) when the
        first request needs it.

        Returns at once (no I/O until a request); the same client for the same instance on
        every call, until `close`.
        """

    def implicit_instances(self, fleet: str) -> list[Instance]:
        """The machines `fleet` has without a fleet resource creating them, partial (the
        local provider: this machine, for the implicit fleet `local`). Most providers have
        none.

        Instant and pure (no I/O): `refresh` completes them.
        """
        return []

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (SSH tunnels, HTTP clients). Safe to call twice; the provider
        may be used again afterwards (it reconnects)."""


FleetProviders = Callable[[str], "Provider | None"]
"""The provider of a fleet, by fleet name (None: the fleet has no provider in this version)."""
