"""Managed disks of the `azure` provider through azure-mgmt-compute, against the local fake of
Azure Resource Manager (tests/infra/fake_arm.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dstack_plan.config.volume import VolumeSpec
from dstack_plan.errors import ProviderError
from dstack_plan.providers.azure.provider import AzureProvider
from dstack_plan.providers.base import Instance
from dstack_plan.providers.capabilities import ProviderWithVolumes, supports
from tests.infra.fake_arm import SUBSCRIPTION, FakeARM
from tests.integration import test_azure_provider as provider_tests
from tests.integration.test_azure_provider import REGION, _provider

pytestmark = pytest.mark.azure
arm, cert = provider_tests.arm, provider_tests.cert  # their fixtures, found here by name
GROUP = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/dstack-plan-life"


def _spec(**fields: Any) -> VolumeSpec:
    return VolumeSpec.model_validate(
        {"name": "data", "backend": "azure", "region": REGION, **fields}
    )


async def _machine(p: AzureProvider, fleet: str = "vols") -> Instance:
    offer = next(o for o in await p.offers() if o.instance_type == "Standard_D4s_v5")
    (inst,) = await p.create_instances(fleet, offer, 1)
    return inst


def _data_disks(arm: FakeARM, vm: str) -> list[dict[str, Any]]:
    """The data disks the last PATCH of `vm` sent."""
    body = arm.sent("PATCH", f"/virtualMachines/{vm}")[-1].body
    return list(body["properties"]["storageProfile"]["dataDisks"])


def _disk(arm: FakeARM, disk_id: str) -> dict[str, Any]:
    return arm.resources[disk_id.lower()]


async def test_a_disk_is_created_attached_detached_and_deleted(
    arm: FakeARM, tmp_path: Path
) -> None:
    p = _provider(arm, tmp_path, tags={"team": "ml"})
    assert supports(AzureProvider, ProviderWithVolumes)
    vol = await p.create_volume(_spec(size="49.5GB", tags={"owner": "me"}))
    (put,) = arm.sent("PUT", "/providers/Microsoft.Compute/disks/")
    assert vol.id == put.path and put.path.startswith(f"{GROUP}/providers/Microsoft.Compute/")
    assert put.path.rsplit("/", 1)[1].startswith("data-")
    assert put.body["location"] == REGION and "zones" not in put.body
    assert put.body["sku"] == {"name": "StandardSSD_LRS"}
    assert put.body["properties"] == {"creationData": {"createOption": "Empty"}, "diskSizeGB": 50}
    assert put.body["tags"] == {
        "dstack-plan:project": "life",
        "dstack-plan:lineage": "l1",
        "dstack-plan:volume": "data",
        "team": "ml",
        "owner": "me",
    }
    assert (vol.name, vol.region, vol.zone, vol.size_gb) == ("data", REGION, None, 50)
    assert vol.status == "active" and not vol.external and vol.attached_to == ()

    inst = await _machine(p)
    assert await p.attach_volume(vol, inst) == "/dev/disk/azure/scsi1/lun0"
    assert _data_disks(arm, inst.id) == [
        {"lun": 0, "createOption": "Attach", "managedDisk": {"id": vol.id}}
    ]
    assert "osDisk" not in arm.sent("PATCH")[-1].body["properties"]["storageProfile"]
    (seen,) = await p.refresh_volumes([vol])
    assert seen.attached_to == (inst.id,) and seen.status == "active"
    patches = len(arm.sent("PATCH"))
    assert await p.attach_volume(vol, inst) == "/dev/disk/azure/scsi1/lun0"  # already there
    assert len(arm.sent("PATCH")) == patches

    other = await p.create_volume(_spec(name="logs", size="10GB"))
    assert await p.attach_volume(other, inst) == "/dev/disk/azure/scsi1/lun1"
    assert [(d["lun"], d["managedDisk"]["id"]) for d in _data_disks(arm, inst.id)] == [
        (0, vol.id),
        (1, other.id),
    ]

    await p.detach_volume(vol, inst)
    assert [d["managedDisk"]["id"] for d in _data_disks(arm, inst.id)] == [other.id]
    assert (await p.refresh_volumes([vol]))[0].attached_to == ()
    patches = len(arm.sent("PATCH"))
    await p.detach_volume(vol, inst)  # not attached: silent, nothing sent
    assert len(arm.sent("PATCH")) == patches
    assert await p.attach_volume(vol, inst) == "/dev/disk/azure/scsi1/lun0"  # first free

    await p.delete_volume(vol)  # attached: detached first (ARM refuses otherwise)
    assert [d["managedDisk"]["id"] for d in _data_disks(arm, inst.id)] == [other.id]
    (delete,) = arm.sent("DELETE", "/disks/")
    assert delete.path == vol.id
    assert arm.requests.index(delete) > arm.requests.index(arm.sent("PATCH")[-1])
    assert await p.refresh_volumes([vol]) == []
    await p.delete_volume(vol)  # gone: silent
    assert len(arm.sent("DELETE", "/disks/")) == 1

    await p.terminate([inst])  # Azure detaches a deleted VM's data disks
    (left,) = await p.refresh_volumes([other])
    assert left.attached_to == () and arm.disks() == [_disk(arm, other.id)]
    await p.close()


async def test_a_zonal_disk_and_its_status(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    vol = await p.create_volume(_spec(size="1.5GB", availability_zone="2"))
    (put,) = arm.sent("PUT", "/disks/")
    assert put.body["zones"] == ["2"] and put.body["properties"]["diskSizeGB"] == 2
    assert vol.zone == "2" and vol.size_gb == 2

    inst = await _machine(p)  # the provider's VMs have no zone
    with pytest.raises(ProviderError, match=f"is in zone 2, VM {inst.id} in no zone"):
        await p.attach_volume(vol, inst)

    props = _disk(arm, vol.id)["properties"]
    for state, status in (("Updating", "provisioning"), ("Failed", "failed")):
        props["provisioningState"] = state
        assert [v.status for v in await p.refresh_volumes([vol])] == [status]
    props["provisioningState"] = "Succeeded"
    props["diskState"] = "ReadyToUpload"
    assert [v.status for v in await p.refresh_volumes([vol])] == ["provisioning"]
    props["provisioningState"] = "Deleting"
    assert await p.refresh_volumes([vol]) == []
    await p.close()


async def test_a_disk_attached_elsewhere_is_refused(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    vol = await p.create_volume(_spec(size="10GB"))
    first, second = await _machine(p, "a"), await _machine(p, "b")
    await p.attach_volume(vol, first)
    with pytest.raises(ProviderError, match=f"disk .* is attached to {first.id}"):
        await p.attach_volume(vol, second)
    ghost = second.model_copy(update={"id": "nope-123456"})
    with pytest.raises(ProviderError, match="VM nope-123456 not found"):
        await p.attach_volume(vol, ghost)
    await p.detach_volume(vol, ghost)  # no such VM: silent
    await p.close()


async def test_a_registered_disk_is_never_changed_or_deleted(arm: FakeARM, tmp_path: Path) -> None:
    elsewhere = _provider(arm, tmp_path, resource_group="shared")
    shared = await elsewhere.create_volume(_spec(size="10GB"))
    p = _provider(arm, tmp_path)
    own = await p.create_volume(_spec(name="own", size="10GB"))
    puts = len(arm.sent("PUT", "/disks/"))

    by_id = await p.create_volume(_spec(volume_id=shared.id))
    by_name = await p.create_volume(_spec(volume_id=own.id.rsplit("/", 1)[1]))
    assert by_id.external and by_id.id == shared.id and "/resourceGroups/shared/" in by_id.id
    assert by_name.external and by_name.id == own.id and by_name.name == "own"
    assert len(arm.sent("PUT", "/disks/")) == puts

    inst = await _machine(p)
    await p.attach_volume(by_id, inst)
    await p.delete_volume(by_id)
    await p.delete_volume(by_name)
    assert not arm.sent("DELETE", "/disks/") and len(arm.disks()) == 2
    assert (await p.refresh_volumes([by_id]))[0].attached_to == (inst.id,)

    with pytest.raises(ProviderError, match="disk nope not found in resource group dstack-"):
        await p.create_volume(_spec(volume_id="nope"))
    with pytest.raises(ProviderError, match="/nope is not an ARM resource id"):
        await p.create_volume(_spec(volume_id="/nope"))
    await p.close()
    await elsewhere.close()


async def test_quota_and_failed_operations_are_clear(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    arm.disk_quota = 0
    with pytest.raises(ProviderError) as e:
        await p.create_volume(_spec(size="10GB"))
    message = str(e.value)
    assert message.startswith("azure: no quota or capacity creating disk data-")
    assert f"in {REGION} (OperationNotAllowed): Operation results in exceeding quota" in message
    assert arm.disks() == []

    arm.disk_quota = None
    arm.disk_failure = ("lro", "InternalDiskManagementError")
    with pytest.raises(ProviderError, match="InternalDiskManagementError creating disk data-"):
        await p.create_volume(_spec(size="10GB"))
    assert arm.disks() == [] and len(arm.sent("DELETE", "/disks/")) == 1  # not left behind

    arm.disk_failure = (400, "InvalidParameter")
    with pytest.raises(ProviderError, match="InvalidParameter creating disk data-"):
        await p.create_volume(_spec(size="10GB"))
    await p.close()


async def test_a_missing_disk_is_left_out(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    kept, lost = [await p.create_volume(_spec(size="10GB")) for _ in range(2)]
    del arm.resources[lost.id.lower()]  # deleted behind dstack-plan's back
    assert [v.id for v in await p.refresh_volumes([lost, kept])] == [kept.id]
    inst = await _machine(p)
    with pytest.raises(ProviderError, match="disk data-.* no longer exists"):
        await p.attach_volume(lost, inst)
    await p.delete_volume(lost)  # gone: silent

    # the group itself gone: nothing is there, and that is no error
    q = _provider(arm, tmp_path, resource_group="never-made")
    orphan = lost.model_copy(update={"id": lost.id.replace("dstack-plan-life", "never-made")})
    assert await q.refresh_volumes([orphan]) == []
    await p.close()
    await q.close()
