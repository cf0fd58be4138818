"""EBS volumes of the `aws` provider against moto's EC2 (a real boto3 client on loopback)."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.config.volume import VolumeSpec
from dstack_plan.errors import ProviderError
from dstack_plan.providers.aws.provider import AWSProvider
from tests.integration.test_aws_provider import REGION, _provider


def _spec(**fields: Any) -> VolumeSpec:
    return VolumeSpec.model_validate(
        {"name": "data", "backend": "aws", "region": REGION, **fields}
    )


async def _machine(p: AWSProvider) -> Any:
    offer = next(o for o in await p.offers() if o.instance_type == "t3.medium" and not o.spot)
    (inst,) = await p.create_instances("vols", offer, 1)
    return inst


async def test_a_volume_is_created_attached_detached_and_deleted(moto_server: Any) -> None:
    p = _provider(moto_server, "vols")
    vol = await p.create_volume(_spec(size="50GB", tags={"team": "ml"}))
    assert vol.size_gb == 50 and vol.zone == f"{REGION}a" and not vol.external
    raw = p.client(REGION).describe_volumes(VolumeIds=[vol.id])["Volumes"][0]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["dstack-plan:project"] == "vols" and tags["dstack-plan:volume"] == "data"
    assert tags["team"] == "ml" and raw["VolumeType"] == "gp3"

    inst = await _machine(p)
    device = await p.attach_volume(vol, inst)
    assert device == "/dev/sdf"
    assert await p.attach_volume(vol, inst) == device  # again: the same device
    (seen,) = await p.refresh_volumes([vol])
    assert seen.attached_to == (inst.id,) and seen.status == "active"

    await p.detach_volume(vol, inst)
    (seen,) = await p.refresh_volumes([vol])
    assert seen.attached_to == ()
    await p.detach_volume(vol, inst)  # not attached: silent

    await p.attach_volume(vol, inst)
    await p.delete_volume(vol)  # detaches first
    assert await p.refresh_volumes([vol]) == []
    await p.delete_volume(vol)  # gone: silent


async def test_a_registered_volume_is_read_and_never_deleted(moto_server: Any) -> None:
    p = _provider(moto_server, "vols-ext")
    ec2 = p.client(REGION)
    made = ec2.create_volume(AvailabilityZone=f"{REGION}b", Size=8)["VolumeId"]
    vol = await p.create_volume(_spec(volume_id=made))
    assert vol.external and vol.id == made and vol.size_gb == 8 and vol.zone == f"{REGION}b"
    await p.delete_volume(vol)
    assert ec2.describe_volumes(VolumeIds=[made])["Volumes"][0]["State"] == "available"

    with pytest.raises(ProviderError, match=f"volume vol-00000000 not found in {REGION}"):
        await p.create_volume(_spec(volume_id="vol-00000000"))


async def test_a_volume_in_another_zone_is_not_attached(moto_server: Any) -> None:
    p = _provider(moto_server, "vols-zone")
    inst = await _machine(p)
    vol = await p.create_volume(_spec(size="10GB", availability_zone=f"{REGION}c"))
    zone = p.client(REGION).describe_instances(InstanceIds=[inst.id])["Reservations"][0][
        "Instances"
    ][0]["Placement"]["AvailabilityZone"]
    if zone == f"{REGION}c":
        pytest.fail("moto placed the instance in the volume's zone: pick another zone")
    with pytest.raises(ProviderError, match=f"is in {REGION}c, instance {inst.id} in {zone}"):
        await p.attach_volume(vol, inst)
