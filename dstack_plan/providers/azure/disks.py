"""Managed disks for the `azure` provider: create, register, attach, detach, delete.

A mixin of `AzureProvider` (it uses the provider's clients, long-running operations and error
handling). Disks are Standard SSDs (`StandardSSD_LRS`) in the provider's resource group,
tagged like VMs (`dstack-plan:project`, `dstack-plan:lineage`, `dstack-plan:volume`).

A volume's id is the disk's ARM resource id
(`/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/disks/NAME`), not its name:
a VM's data disk refers to a disk by that id, and it also names a registered disk that lives
in another resource group. `volume_id` takes such an id, or a disk name in the provider's
group; a registered disk is only read, never changed or deleted.

A disk attaches as a data disk of the VM at its first free LUN and shows on the machine as
`/dev/disk/azure/scsi1/lunN`, the link the udev rules of Azure's Linux images make (the
`/dev/sdX` name depends on probe order). Azure attaches a zonal disk (`availability_zone:
"1"`) only to a VM in that zone and a regional disk only to a VM without one; the provider's
VMs have no zone, so their volumes leave `availability_zone` out.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import secrets
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from dstack_plan.errors import ProviderError
from dstack_plan.providers.azure.arm import arm_model, capacity_code
from dstack_plan.providers.capabilities import ProviderWithVolumes, Volume

if TYPE_CHECKING:
    from dstack_plan.config.backends import AzureBackend
    from dstack_plan.config.volume import VolumeSpec
    from dstack_plan.providers.base import Instance

T = TypeVar("T")
NAME = "azure"
SKU = "StandardSSD_LRS"
_UPLOADING = frozenset({"readytoupload", "activeupload"})


def lun_device(lun: int) -> str:
    """Where a data disk at `lun` shows on a machine."""
    return f"/dev/disk/azure/scsi1/lun{lun}"


def _parts(arm_id: str) -> tuple[str, str]:
    """The resource group and name of an ARM resource id."""
    parts = arm_id.strip("/").split("/")
    if len(parts) != 8 or parts[2].lower() != "resourcegroups":
        raise ProviderError(NAME, f"{arm_id} is not an ARM resource id (nor a disk name)")
    return parts[3], parts[7]


def _text(value: Any) -> str:
    """A field's text, lower-cased: `str()` of the SDK's enums is `DiskState.ATTACHED`."""
    return str(getattr(value, "value", value) or "").lower()


def _status(disk: Any) -> str | None:
    """What a disk is for the contract; None while it is being deleted (gone)."""
    state = _text(disk.provisioning_state)
    if state == "deleting":
        return None
    if state == "failed":
        return "failed"
    if state != "succeeded" or _text(disk.disk_state) in _UPLOADING:
        return "provisioning"
    return "active"


def _refers_to(data_disk: Any, disk_id: str) -> bool:
    managed = data_disk.managed_disk
    return managed is not None and str(managed.id or "").lower() == disk_id.lower()


def _where(zone: str | None) -> str:
    return f"zone {zone}" if zone else "no zone"


class ManagedDisks(ProviderWithVolumes):
    """The volume capability of `AzureProvider`."""

    config: AzureBackend | None

    @property
    @abstractmethod
    def resource_group(self) -> str:
        """The group everything is created in (AzureProvider's)."""

    @abstractmethod
    def client(self, kind: str) -> Any:
        """A management client: `compute`, `network` or `resource` (AzureProvider's)."""

    @abstractmethod
    async def _call(self, fn: Callable[[], T]) -> T:
        """A blocking SDK call off the loop, credential failures ProviderErrors
        (AzureProvider's)."""

    @abstractmethod
    async def _api(self, fn: Callable[[], T], doing: str) -> T:
        """`_call` with any ARM error a ProviderError saying what failed (AzureProvider's)."""

    @abstractmethod
    def _failure(self, e: Any, doing: str) -> ProviderError:
        """An ARM error as a ProviderError (AzureProvider's)."""

    @abstractmethod
    def _clean(self, text: str) -> str:
        """An SDK message's first line, secrets out (AzureProvider's)."""

    @abstractmethod
    def _tags(self, **extra: str) -> dict[str, str]:
        """The project's (and lineage's) tags, and `extra` (AzureProvider's)."""

    @abstractmethod
    async def _ensure_group(self, region: str) -> None:
        """Make the resource group on first use (AzureProvider's)."""

    # -- reading

    def _disk_id(self, name: str) -> str:
        assert self.config is not None  # client() refused to be made otherwise
        return (
            f"/subscriptions/{self.config.subscription_id}/resourceGroups/"
            f"{self.resource_group}/providers/Microsoft.Compute/disks/{name}"
        )

    def _volume(self, disk: Any, external: bool) -> Volume | None:
        status = _status(disk)
        if status is None:
            return None
        tags = dict(disk.tags or {})
        zones = list(disk.zones or [])
        owner = disk.managed_by
        return Volume(
            provider=NAME,
            id=str(disk.id),
            name=tags.get("dstack-plan:volume", str(disk.name)),
            region=str(disk.location),
            zone=str(zones[0]) if zones else None,
            size_gb=float(disk.disk_size_gb) if disk.disk_size_gb is not None else None,
            attached_to=(_parts(owner)[1],) if owner else (),  # a VM's name is its instance id
            external=external,
            status=status,  # type: ignore[arg-type]
        )

    async def _read(self, ops: Any, group: str, name: str, what: str) -> Any | None:
        """The disk or VM `name` of `group`; None when it (or its group) does not exist."""
        from azure.core import exceptions as ax

        try:
            return await self._call(functools.partial(ops.get, group, name))
        except ax.ResourceNotFoundError:
            return None
        except ax.HttpResponseError as e:
            raise self._failure(e, f"reading {what} {name}") from None

    async def _read_disk(self, disk_id: str) -> Any | None:
        return await self._read(self.client("compute").disks, *_parts(disk_id), "disk")

    async def _read_vm(self, group: str, name: str) -> Any | None:
        return await self._read(self.client("compute").virtual_machines, group, name, "VM")

    # -- the capability

    async def create_volume(self, spec: VolumeSpec) -> Volume:
        """A new empty Standard SSD of `spec.size` in `spec.region` (in
        `spec.availability_zone` when given), once Azure has made it (seconds); or the disk
        `spec.volume_id` registered as it is."""
        from azure.core import exceptions as ax
        from azure.mgmt.compute import models as cm

        disks = self.client("compute").disks
        region = spec.region or ""
        if spec.volume_id:
            wanted, by_id = spec.volume_id, spec.volume_id.startswith("/")
            raw = await self._read_disk(wanted if by_id else self._disk_id(wanted))
            found = self._volume(raw, external=True) if raw is not None else None
            if found is None:
                where = "" if by_id else f" in resource group {self.resource_group}"
                raise ProviderError(NAME, f"disk {wanted} not found{where}")
            return found
        assert spec.size is not None  # the config requires size or volume_id
        await self._ensure_group(region)
        label = spec.name or "volume"
        stem = re.sub(r"[^a-z0-9-]+", "-", label.lower()).strip("-")[:70]
        name = f"{stem or 'volume'}-{secrets.token_hex(3)}"
        zone = spec.availability_zone
        body = arm_model(
            cm.Disk,
            location=region,
            zones=[zone] if zone else None,
            tags={**self._tags(volume=label), **(spec.tags or {})},
            sku=cm.DiskSku(name=SKU),
            creation_data=cm.CreationData(create_option="Empty"),
            disk_size_gb=max(1, math.ceil(spec.size)),
        )
        group, doing = self.resource_group, f"creating disk {name} in {region}"
        begin = functools.partial(disks.begin_create_or_update, group, name, body)
        try:
            poller = await self._call(begin)
        except ax.HttpResponseError as e:
            raise self._disk_error(e, doing) from None
        try:
            made = await self._call(poller.result)
        except ax.HttpResponseError as e:
            await self._delete_disk(self._disk_id(name))  # a failed disk stays, unrecorded
            raise self._disk_error(e, doing) from None
        volume = self._volume(made, external=False)
        return volume or Volume(provider=NAME, id=self._disk_id(name), name=label, region=region)

    def _disk_error(self, e: Any, doing: str) -> ProviderError:
        code = capacity_code(e)
        if code is None:
            return self._failure(e, doing)
        message = self._clean(str(getattr(e.error, "message", "") or ""))
        return ProviderError(NAME, f"no quota or capacity {doing} ({code}): {message}")

    async def refresh_volumes(self, volumes: Sequence[Volume]) -> list[Volume]:
        """The disks as Azure sees them now; deleted ones (or their group) left out."""
        out: list[Volume] = []
        for v in volumes:
            raw = await self._read_disk(v.id)
            found = self._volume(raw, v.external) if raw is not None else None
            if found is not None:
                out.append(found)
        return out

    async def delete_volume(self, volume: Volume) -> None:
        """Detach from its VM (waiting for it) and start deleting a created disk; a
        registered one is only forgotten. Already gone is silent."""
        if volume.external:
            return
        raw = await self._read_disk(volume.id)
        if raw is None:
            return
        if raw.managed_by:
            group, vm_name = _parts(raw.managed_by)
            await self._detach(volume, group, vm_name)
            await self.wait_for_volume(volume, lambda v: not v.attached_to, "detached")
        await self._delete_disk(volume.id)

    async def _delete_disk(self, disk_id: str) -> None:
        from azure.core import exceptions as ax

        group, name = _parts(disk_id)
        disks = self.client("compute").disks
        # polling=False: accepted is enough; the caller waits for the disk to be gone
        delete = functools.partial(disks.begin_delete, group, name, polling=False)
        try:
            await self._call(delete)
        except ax.ResourceNotFoundError:
            return
        except ax.HttpResponseError as e:
            raise self._failure(e, f"deleting disk {name}") from None

    async def attach_volume(self, volume: Volume, instance: Instance) -> str:
        """Add the disk to the VM's data disks at its first free LUN and wait for the
        update."""
        from azure.mgmt.compute import models as cm

        name = _parts(volume.id)[1]
        raw = await self._read_disk(volume.id)
        current = self._volume(raw, volume.external) if raw is not None else None
        if current is None:
            raise ProviderError(NAME, f"disk {name} no longer exists")
        group = self.resource_group
        vm = await self._read_vm(group, instance.id)
        if vm is None:
            raise ProviderError(NAME, f"VM {instance.id} not found, attaching disk {name}")
        data_disks = list(vm.storage_profile.data_disks or [])
        for d in data_disks:
            if _refers_to(d, volume.id):
                return lun_device(int(d.lun))
        if current.attached_to:
            raise ProviderError(
                NAME, f"disk {name} is attached to {', '.join(current.attached_to)}"
            )
        vm_zone = str(vm.zones[0]) if vm.zones else None
        if current.zone != vm_zone:
            raise ProviderError(
                NAME,
                f"disk {name} is in {_where(current.zone)}, VM {instance.id} in {_where(vm_zone)}",
            )
        if str(vm.location).lower() != current.region.lower():
            raise ProviderError(
                NAME, f"disk {name} is in {current.region}, VM {instance.id} in {vm.location}"
            )
        used = {int(d.lun) for d in data_disks}
        lun = next(n for n in itertools.count() if n not in used)
        managed = cm.ManagedDiskParameters(id=volume.id)
        data_disks.append(cm.DataDisk(lun=lun, create_option="Attach", managed_disk=managed))
        await self._set_data_disks(group, instance.id, data_disks, f"attaching disk {name}")
        return lun_device(lun)

    async def detach_volume(self, volume: Volume, instance: Instance) -> None:
        """Remove the disk from the VM's data disks and wait for the update; not attached
        there (or no such VM) is silent."""
        await self._detach(volume, self.resource_group, instance.id)

    async def _detach(self, volume: Volume, group: str, vm_name: str) -> None:
        vm = await self._read_vm(group, vm_name)
        if vm is None:
            return
        data_disks = list(vm.storage_profile.data_disks or [])
        kept = [d for d in data_disks if not _refers_to(d, volume.id)]
        if len(kept) < len(data_disks):
            doing = f"detaching disk {_parts(volume.id)[1]}"
            await self._set_data_disks(group, vm_name, kept, doing)

    async def _set_data_disks(
        self, group: str, vm_name: str, data_disks: list[Any], doing: str
    ) -> None:
        """PATCH the VM's data disk list: a PUT would send back all of the VM as read."""
        from azure.mgmt.compute import models as cm

        vms = self.client("compute").virtual_machines
        update = arm_model(
            cm.VirtualMachineUpdate, storage_profile=cm.StorageProfile(data_disks=data_disks)
        )
        doing = f"{doing} on VM {vm_name}"
        begin = functools.partial(vms.begin_update, group, vm_name, update)
        poller = await self._api(begin, doing)
        await self._api(poller.result, doing)
