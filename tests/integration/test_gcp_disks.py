"""Persistent disks of the `gcp` provider through google-cloud-compute, against the local
Compute Engine fake (tests/infra/fake_gcp.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dstack_plan.config.volume import VolumeSpec
from dstack_plan.errors import ProviderError
from dstack_plan.providers.gcp.provider import GCPProvider
from tests.infra.fake_gcp import FakeGCP
from tests.integration.test_gcp_provider import REGION, _provider

pytestmark = pytest.mark.gcp


def _spec(**fields: Any) -> VolumeSpec:
    return VolumeSpec.model_validate(
        {"name": "data", "backend": "gcp", "region": REGION, **fields}
    )


async def _machine(p: GCPProvider) -> Any:
    offer = next(o for o in await p.offers() if o.instance_type == "e2-standard-4" and not o.spot)
    (inst,) = await p.create_instances("vols", offer, 1)
    return inst


async def test_a_disk_is_created_attached_detached_and_deleted(
    gcp: FakeGCP, tmp_path: Path
) -> None:
    p = _provider(gcp, tmp_path)
    vol = await p.create_volume(_spec(size="50GB", tags={"team": "ml"}))
    zone, _, name = vol.id.partition("/")
    assert zone == f"{REGION}-a" and name.startswith("data-0-")
    body = gcp.disks[(zone, name)]
    assert body["sizeGb"] == "50" and body["type"].endswith("/diskTypes/pd-balanced")
    assert body["labels"] == {
        "dstack-plan-project": "life",
        "dstack-plan-lineage": "l1",
        "dstack-plan-volume": "data",
        "team": "ml",
    }
    (ready,) = await p.refresh_volumes([vol])
    assert ready.status == "active" and ready.size_gb == 50

    inst = await _machine(p)  # in zone -a too
    device = await p.attach_volume(ready, inst)
    assert device == f"/dev/disk/by-id/google-dstack-{name}"
    assert await p.attach_volume(ready, inst) == device
    (seen,) = await p.refresh_volumes([vol])
    assert seen.attached_to == (inst.id,)

    await p.detach_volume(vol, inst)
    assert (await p.refresh_volumes([vol]))[0].attached_to == ()
    await p.detach_volume(vol, inst)  # not attached: silent

    await p.attach_volume(vol, inst)
    await p.delete_volume(vol)  # detaches first
    assert await p.refresh_volumes([vol]) == [] and gcp.disks == {}
    await p.delete_volume(vol)  # gone: silent


async def test_a_registered_disk_is_never_deleted_and_zones_must_match(
    gcp: FakeGCP, tmp_path: Path
) -> None:
    p = _provider(gcp, tmp_path)
    made = await p.create_volume(_spec(size="10GB", availability_zone=f"{REGION}-b"))
    disk_name = made.id.partition("/")[2]
    registered = await p.create_volume(_spec(volume_id=disk_name, availability_zone=f"{REGION}-b"))
    assert registered.external and registered.id == made.id
    await p.delete_volume(registered)
    assert (f"{REGION}-b", disk_name) in gcp.disks

    inst = await _machine(p)
    with pytest.raises(ProviderError, match=f"is in {REGION}-b, instance {inst.id} in {REGION}-a"):
        await p.attach_volume(registered, inst)
    with pytest.raises(ProviderError, match=f"disk nope not found in {REGION}-a"):
        await p.create_volume(_spec(volume_id="nope"))
