"""EBS volumes for the `aws` provider: create, register, attach, detach, delete.

A mixin of `AWSProvider` (it uses the provider's clients and error handling). Volumes are
tagged like instances (`dstack-plan:project`, `dstack-plan:lineage`, `dstack-plan:volume`);
a volume registered by `volume_id` is only read, never changed or deleted.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from dstack_plan.errors import ProviderError
from dstack_plan.providers.capabilities import ProviderWithVolumes, Volume

if TYPE_CHECKING:
    from dstack_plan.config.backends import AWSBackend
    from dstack_plan.config.volume import VolumeSpec
    from dstack_plan.providers.base import Instance

T = TypeVar("T")
NAME = "aws"
DEVICES = tuple(f"/dev/sd{c}" for c in "fghijklmnop")
"""Where attached volumes appear (EC2's recommended range for EBS data volumes)."""
_STATUS = {
    "creating": "provisioning",
    "available": "active",
    "in-use": "active",
    "error": "failed",
}


class EBSVolumes(ProviderWithVolumes):
    """The volume capability of `AWSProvider`."""

    project: str
    lineage: str
    config: AWSBackend | None

    @abstractmethod
    def client(self, region: str) -> Any:
        """The EC2 client for `region` (AWSProvider's)."""

    @abstractmethod
    async def _call(self, fn: Callable[[], T]) -> T:
        """A blocking boto3 call off the loop (AWSProvider's)."""

    @abstractmethod
    async def _api(self, fn: Callable[[], T], doing: str = "") -> T:
        """`_call` with EC2's errors ProviderErrors saying what failed (AWSProvider's)."""

    def _volume(self, raw: dict[str, Any], region: str, external: bool) -> Volume:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        return Volume(
            provider=NAME,
            id=raw["VolumeId"],
            name=tags.get("dstack-plan:volume", raw["VolumeId"]),
            region=region,
            zone=raw.get("AvailabilityZone"),
            size_gb=float(raw["Size"]),
            attached_to=tuple(
                a["InstanceId"]
                for a in raw.get("Attachments", [])
                if a.get("State") in ("attaching", "attached")
            ),
            external=external,
            status=_STATUS.get(raw["State"], "provisioning"),  # type: ignore[arg-type]
        )

    async def _described(self, region: str, ids: Sequence[str]) -> list[dict[str, Any]]:
        ec2 = self.client(region)
        filters = [{"Name": "volume-id", "Values": list(ids)}]  # unknown ids: no error
        resp = await self._api(
            functools.partial(ec2.describe_volumes, Filters=filters), "reading volumes"
        )
        return list(resp["Volumes"])

    async def create_volume(self, spec: VolumeSpec) -> Volume:
        """A new gp3 volume of `spec.size` in `spec.availability_zone` (else the region's
        first zone), or the existing `spec.volume_id` registered as it is."""
        region = spec.region or ""
        if spec.volume_id:
            found = await self._described(region, [spec.volume_id])
            if not found:
                raise ProviderError(NAME, f"volume {spec.volume_id} not found in {region}")
            return self._volume(found[0], region, external=True)
        assert spec.size is not None  # the config requires size or volume_id
        zone = spec.availability_zone or f"{region}a"
        tags = {
            "dstack-plan:project": self.project,
            "dstack-plan:lineage": self.lineage,
            "dstack-plan:volume": spec.name or "volume",
            "Name": spec.name or "volume",
            **(self.config.tags if self.config else {}),
            **(spec.tags or {}),
        }
        ec2 = self.client(region)
        create = functools.partial(
            ec2.create_volume,
            AvailabilityZone=zone,
            Size=max(1, math.ceil(spec.size)),
            VolumeType="gp3",
            TagSpecifications=[
                {
                    "ResourceType": "volume",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ],
        )
        raw = await self._api(create, f"creating volume {spec.name} in {zone}")
        return self._volume(raw, region, external=False)

    async def refresh_volumes(self, volumes: Sequence[Volume]) -> list[Volume]:
        """The volumes as EC2 sees them now; deleted ones left out."""
        out: list[Volume] = []
        for region in {v.region for v in volumes}:
            mine = {v.id: v for v in volumes if v.region == region}
            for raw in await self._described(region, list(mine)):
                if raw["State"] in ("deleting", "deleted"):
                    continue
                out.append(self._volume(raw, region, external=mine[raw["VolumeId"]].external))
        return out

    async def delete_volume(self, volume: Volume) -> None:
        """Detach (waiting for it) and delete a created volume; a registered one is only
        forgotten. Already gone is silent."""
        if volume.external:
            return
        current = await self.refresh_volumes([volume])
        if not current:
            return
        for instance_id in current[0].attached_to:
            await self._detach(volume, instance_id)
        await self.wait_for_volume(volume, lambda v: not v.attached_to, "detached")
        ec2 = self.client(volume.region)
        await self._api(
            functools.partial(ec2.delete_volume, VolumeId=volume.id), f"deleting {volume.id}"
        )

    def device_paths(self, volume: Volume, device: str) -> tuple[str, ...]:
        """On Nitro machines an EBS volume is an NVMe disk whose udev link names the volume
        id; older (Xen) ones show `/dev/sdf` as `/dev/xvdf`."""
        by_id = f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume.id.replace('-', '')}"
        return (by_id, device, device.replace("/dev/sd", "/dev/xvd"))

    async def attach_volume(self, volume: Volume, instance: Instance) -> str:
        """Attach at the first free device of DEVICES and wait until attached."""
        found = await self.refresh_volumes([volume])
        if not found:
            raise ProviderError(NAME, f"volume {volume.id} no longer exists")
        current = found[0]
        ec2 = self.client(volume.region)
        resp = await self._api(
            functools.partial(ec2.describe_instances, InstanceIds=[instance.id]),
            f"reading {instance.id}",
        )
        raw = resp["Reservations"][0]["Instances"][0]
        mapped = {
            m["Ebs"]["VolumeId"]: m["DeviceName"] for m in raw.get("BlockDeviceMappings", [])
        }
        if volume.id in mapped:
            return str(mapped[volume.id])
        zone = raw.get("Placement", {}).get("AvailabilityZone")
        if current.zone and zone and current.zone != zone:
            raise ProviderError(
                NAME, f"volume {volume.id} is in {current.zone}, instance {instance.id} in {zone}"
            )
        if current.attached_to:
            raise ProviderError(
                NAME, f"volume {volume.id} is attached to {', '.join(current.attached_to)}"
            )
        device = next((d for d in DEVICES if d not in mapped.values()), None)
        if device is None:
            raise ProviderError(NAME, f"no free device left on {instance.id}")
        attach = functools.partial(
            ec2.attach_volume, VolumeId=volume.id, InstanceId=instance.id, Device=device
        )
        await self._api(attach, f"attaching {volume.id} to {instance.id}")
        await self.wait_for_volume(volume, lambda v: instance.id in v.attached_to, "attached")
        return device

    async def detach_volume(self, volume: Volume, instance: Instance) -> None:
        """Start detaching; not attached there is silent."""
        await self._detach(volume, instance.id)

    async def _detach(self, volume: Volume, instance_id: str) -> None:
        import botocore.exceptions as bx

        ec2 = self.client(volume.region)
        detach = functools.partial(ec2.detach_volume, VolumeId=volume.id, InstanceId=instance_id)
        try:
            await self._call(detach)
        except bx.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code not in (
                "IncorrectState",
                "InvalidAttachment.NotFound",
                "InvalidVolume.NotFound",
            ):
                raise ProviderError(NAME, f"EC2 error {code} detaching {volume.id}") from None
