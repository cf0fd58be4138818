"""What a provider can do beyond machines: volumes and gateways, opted into with a mixin.

A provider that supports a feature also subclasses its `ProviderWith*` class, as dstack's
`ComputeWith*` classes do; `supports` detects it with `issubclass`, so asking needs no
instance (and no I/O). The base `Provider` has no stubs for these: a provider without the
mixin simply does not have the methods.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from dstack_plan.errors import ProviderError
from dstack_plan.providers.base import Instance, Provider

if TYPE_CHECKING:
    from dstack_plan.config.gateway import GatewaySpec
    from dstack_plan.config.volume import VolumeSpec
    from dstack_plan.providers.catalog import RegionPrice


class Volume(BaseModel):
    """A network disk a provider holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str
    id: str
    name: str
    region: str
    zone: str | None = None
    """The availability zone it lives in (the machines that mount it must be there); None
    while not known."""
    size_gb: float | None = None
    """None while not known (a partial volume, before `refresh_volumes` completes it)."""
    attached_to: tuple[str, ...] = ()
    """The ids of the instances it is attached to now."""
    external: bool = False
    """Registered by `volume_id`, not created: never deleted physically."""
    status: Literal["submitted", "provisioning", "active", "failed"] = "submitted"


class Gateway(BaseModel):
    """A public machine that serves a project's services."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str
    id: str
    name: str
    region: str
    hostname: str | None = None
    """Its public address, None until it is known."""
    status: Literal["submitted", "provisioning", "running", "failed"] = "submitted"


class ProviderWithVolumes(ABC):
    """A provider that creates, registers and deletes network volumes."""

    @abstractmethod
    async def create_volume(self, spec: VolumeSpec) -> Volume:
        """Start creating the volume `spec` describes, or register the one its `volume_id`
        names, and return it as soon as the provider accepted the request (seconds; a
        partial volume that `refresh_volumes` completes).

        Not idempotent: the caller records the returned id at once; after a crash it finds
        a cut-short create by the provider's tags and deletes it.
        """

    @abstractmethod
    async def refresh_volumes(self, volumes: Sequence[Volume]) -> list[Volume]:
        """The given volumes as they are now; those that no longer exist are left out.
        One batch of reads (seconds), no side effects."""

    @abstractmethod
    async def delete_volume(self, volume: Volume) -> None:
        """Start deleting a created volume (a registered one is only forgotten) and return.
        A volume still attached is detached first (waiting for that, seconds). Idempotent: a
        volume already gone returns silently."""

    @abstractmethod
    async def attach_volume(self, volume: Volume, instance: Instance) -> str:
        """Attach `volume` to `instance` and return the device it appears as on the machine
        (`/dev/sdf`), once attached (seconds). Idempotent: already attached there returns
        its device. ProviderError when it cannot be (another zone, attached elsewhere)."""

    @abstractmethod
    async def detach_volume(self, volume: Volume, instance: Instance) -> None:
        """Start detaching `volume` from `instance` and return. Idempotent: a volume not
        attached there returns silently."""

    def device_paths(self, volume: Volume, device: str) -> tuple[str, ...]:
        """Where the machine may show `volume`, which `attach_volume` reported as `device`,
        most specific first: the agent takes the first that exists."""
        return (device,)

    async def wait_for_volume(
        self, volume: Volume, ok: Callable[[Volume], bool], what: str, *, timeout: float = 120
    ) -> None:
        """Poll `refresh_volumes` until `volume` is gone or `ok(volume)`; ProviderError
        saying it is not `what` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            current = await self.refresh_volumes([volume])
            if not current or ok(current[0]):
                return
            if time.monotonic() > deadline:
                raise ProviderError(
                    volume.provider, f"volume {volume.id} not {what} after {timeout:.0f}s"
                )
            await asyncio.sleep(1.0)


class ProviderWithGateways(ABC):
    """A provider that creates and terminates gateways."""

    @abstractmethod
    async def create_gateway(self, spec: GatewaySpec) -> Gateway:
        """Start creating the gateway `spec` describes and return it as soon as the
        provider accepted the request (seconds; `hostname` may be None until
        `refresh_gateways` completes it). Not idempotent, as `create_volume`."""

    @abstractmethod
    async def refresh_gateways(self, gateways: Sequence[Gateway]) -> list[Gateway]:
        """The given gateways as they are now; those that no longer exist are left out.
        One batch of reads (seconds), no side effects."""

    @abstractmethod
    async def terminate_gateway(self, gateway: Gateway) -> None:
        """Start terminating a gateway and return. Idempotent: one already gone returns
        silently."""


class ProviderWithTags(ABC):
    """A cloud provider that labels what it creates with the project, fleet and lineage, and
    can list it back: destroy and drift checks find machines the state never recorded (an
    apply cut short between create and commit)."""

    @abstractmethod
    async def tagged_instances(self, fleet: str | None = None) -> list[Instance]:
        """Every machine of this project (and lineage) that is not gone, in the configured
        regions, `fleet`'s only when given. Reads only (seconds)."""


class ProviderWithPrices(ABC):
    """A cloud provider that can price its catalogue's machine types from its pricing APIs
    (`dstack catalog refresh`)."""

    @abstractmethod
    async def current_prices(
        self, types: Sequence[str], regions: Sequence[str]
    ) -> dict[tuple[str, str], RegionPrice]:
        """(type, region) → today's price, for the pairs the APIs price (a few seconds to a
        minute of reads). ProviderError when the pricing APIs cannot be reached."""


Capability = (
    type[ProviderWithVolumes]
    | type[ProviderWithGateways]
    | type[ProviderWithTags]
    | type[ProviderWithPrices]
)

CAPABILITY_OF_KIND: dict[str, Capability] = {
    "volume": ProviderWithVolumes,
    "gateway": ProviderWithGateways,
}
"""The capability a provider needs to hold a resource of each kind that is not a machine."""


def supports(provider: Provider | type[Provider], capability: Capability) -> bool:
    """Whether `provider` (a class or an instance) has `capability`."""
    cls = provider if isinstance(provider, type) else type(provider)
    return issubclass(cls, capability)
