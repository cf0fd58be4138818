"""Persistent disks for the `gcp` provider: create, register, attach, detach, delete.

A mixin of `GCPProvider` (it uses the provider's clients, operations and error handling).
Disks are labelled like instances (`dstack-plan-project`, `dstack-plan-lineage`,
`dstack-plan-volume`); a disk registered by `volume_id` (its name, in `availability_zone`)
is only read, never changed or deleted. A volume's id is `ZONE/NAME`, as an instance's.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from dstack_plan.errors import ProviderError
from dstack_plan.providers.capabilities import ProviderWithVolumes, Volume
from dstack_plan.providers.gcp.names import label, vm_name

if TYPE_CHECKING:
    from dstack_plan.config.backends import GCPBackend
    from dstack_plan.config.volume import VolumeSpec
    from dstack_plan.providers.base import Instance

T = TypeVar("T")
NAME = "gcp"
DISK_TYPE = "pd-balanced"
_STATUS = {"CREATING": "provisioning", "RESTORING": "provisioning", "READY": "active"}


class PersistentDisks(ProviderWithVolumes):
    """The volume capability of `GCPProvider`."""

    config: GCPBackend

    @abstractmethod
    def client(self, kind: str) -> Any:
        """A compute_v1 REST client (GCPProvider's)."""

    @abstractmethod
    async def _call(self, fn: Callable[[], T]) -> T:
        """A blocking SDK call off the loop (GCPProvider's)."""

    @abstractmethod
    async def _api(self, fn: Callable[[], T], doing: str) -> T:
        """`_call` with API errors ProviderErrors saying what failed (GCPProvider's)."""

    @abstractmethod
    async def _wait(self, op: Any, zone: str | None) -> Any:
        """An operation once done (GCPProvider's)."""

    @abstractmethod
    def _labels(self, fleet: str | None) -> dict[str, str]:
        """The project's (and lineage's) labels (GCPProvider's)."""

    def _volume(self, raw: Any, zone: str, external: bool, region: str) -> Volume | None:
        status = _STATUS.get(raw.status, "failed" if raw.status == "FAILED" else None)
        if status is None:  # DELETING
            return None
        users = []
        for url in raw.users:  # .../zones/Z/instances/NAME
            parts = url.split("/")
            users.append(f"{parts[-3]}/{parts[-1]}")
        labels = dict(raw.labels)
        return Volume(
            provider=NAME,
            id=f"{zone}/{raw.name}",
            name=labels.get("dstack-plan-volume", raw.name),
            region=region,
            zone=zone,
            size_gb=float(raw.size_gb),
            attached_to=tuple(users),
            external=external,
            status=status,  # type: ignore[arg-type]
        )

    async def _get(self, zone: str, name: str) -> Any | None:
        from google.api_core import exceptions as gex

        disks = self.client("Disks")
        get = functools.partial(disks.get, project=self.config.project_id, zone=zone, disk=name)
        try:
            return await self._call(get)
        except gex.NotFound:
            return None
        except gex.GoogleAPICallError as e:
            raise ProviderError(NAME, f"Compute Engine error {e.code} reading {name}") from None

    async def create_volume(self, spec: VolumeSpec) -> Volume:
        """A new balanced persistent disk of `spec.size` in `spec.availability_zone` (else
        the region's zone `-a`), or the existing disk `spec.volume_id` registered."""
        from google.cloud import compute_v1

        region = spec.region or ""
        zone = spec.availability_zone or f"{region}-a"
        if spec.volume_id:
            raw = await self._get(zone, spec.volume_id)
            found = self._volume(raw, zone, True, region) if raw is not None else None
            if found is None:
                raise ProviderError(
                    NAME, f"disk {spec.volume_id} not found in {zone} (set availability_zone)"
                )
            return found
        assert spec.size is not None  # the config requires size or volume_id
        volume_name = spec.name or "volume"
        name = vm_name(volume_name, 0)
        disk = compute_v1.Disk(
            name=name,
            size_gb=max(1, math.ceil(spec.size)),
            type_=f"zones/{zone}/diskTypes/{DISK_TYPE}",
            labels={
                **self._labels(None),
                "dstack-plan-volume": label(volume_name),
                **self.config.tags,
                **{label(k): label(v) for k, v in (spec.tags or {}).items()},
            },
        )
        disks = self.client("Disks")
        insert = functools.partial(
            disks.insert_unary, project=self.config.project_id, zone=zone, disk_resource=disk
        )
        op = await self._api(insert, f"creating disk {name} in {zone}")
        op = await self._wait(op, zone)
        if op.error and op.error.errors:
            raise ProviderError(NAME, f"{op.error.errors[0].code} creating disk {name}")
        return Volume(
            provider=NAME, id=f"{zone}/{name}", name=volume_name, region=region, zone=zone
        )

    async def refresh_volumes(self, volumes: Sequence[Volume]) -> list[Volume]:
        """The disks as Compute Engine sees them now; deleted ones left out."""
        out: list[Volume] = []
        for v in volumes:
            zone, _, name = v.id.partition("/")
            raw = await self._get(zone, name)
            found = self._volume(raw, zone, v.external, v.region) if raw is not None else None
            if found is not None:
                out.append(found)
        return out

    async def delete_volume(self, volume: Volume) -> None:
        """Detach from every instance (waiting for it) and delete a created disk; a
        registered one is only forgotten. Already gone is silent."""
        from google.api_core import exceptions as gex

        if volume.external:
            return
        current = await self.refresh_volumes([volume])
        if not current:
            return
        for user in current[0].attached_to:
            await self._detach(volume, user)
        await self.wait_for_volume(volume, lambda v: not v.attached_to, "detached")
        zone, _, name = volume.id.partition("/")
        disks = self.client("Disks")
        delete = functools.partial(
            disks.delete_unary, project=self.config.project_id, zone=zone, disk=name
        )
        try:
            await self._call(delete)
        except gex.NotFound:
            return
        except gex.GoogleAPICallError as e:
            raise ProviderError(NAME, f"Compute Engine error {e.code} deleting {name}") from None

    async def attach_volume(self, volume: Volume, instance: Instance) -> str:
        """Attach as device `dstack-VOLUME`; it appears as /dev/disk/by-id/google-THAT."""
        from google.cloud import compute_v1

        found = await self.refresh_volumes([volume])
        if not found:
            raise ProviderError(NAME, f"volume {volume.id} no longer exists")
        current = found[0]
        zone, _, disk_name = volume.id.partition("/")
        device = _device(volume)
        if instance.id in current.attached_to:
            return f"/dev/disk/by-id/google-{device}"
        instance_zone, _, instance_name = instance.id.partition("/")
        if instance_zone != zone:
            raise ProviderError(
                NAME, f"volume {volume.id} is in {zone}, instance {instance.id} in {instance_zone}"
            )
        if current.attached_to:
            raise ProviderError(
                NAME, f"volume {volume.id} is attached to {', '.join(current.attached_to)}"
            )
        source = f"projects/{self.config.project_id}/zones/{zone}/disks/{disk_name}"
        instances = self.client("Instances")
        attach = functools.partial(
            instances.attach_disk_unary,
            project=self.config.project_id,
            zone=zone,
            instance=instance_name,
            attached_disk_resource=compute_v1.AttachedDisk(source=source, device_name=device),
        )
        op = await self._api(attach, f"attaching {volume.id} to {instance.id}")
        await self._wait(op, zone)
        await self.wait_for_volume(volume, lambda v: instance.id in v.attached_to, "attached")
        return f"/dev/disk/by-id/google-{device}"

    async def detach_volume(self, volume: Volume, instance: Instance) -> None:
        """Start detaching; not attached there is silent."""
        await self._detach(volume, instance.id)

    async def _detach(self, volume: Volume, instance_id: str) -> None:
        from google.api_core import exceptions as gex

        zone, _, instance_name = instance_id.partition("/")
        device = _device(volume)
        instances = self.client("Instances")
        detach = functools.partial(
            instances.detach_disk_unary,
            project=self.config.project_id,
            zone=zone,
            instance=instance_name,
            device_name=device,
        )
        try:
            await self._call(detach)
        except (gex.NotFound, gex.BadRequest):  # no such instance, or not attached there
            return
        except gex.GoogleAPICallError as e:
            raise ProviderError(
                NAME, f"Compute Engine error {e.code} detaching {volume.id}"
            ) from None


def _device(volume: Volume) -> str:
    """The device name a volume is attached as (`/dev/disk/by-id/google-THAT`)."""
    return f"dstack-{volume.id.partition('/')[2]}"[:63]
