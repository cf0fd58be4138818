"""The `gcp` provider through the real google-cloud-compute client, against a local fake of
the Compute Engine REST API (tests/infra/fake_gcp.py), authenticated with a real
service-account key file whose token endpoint is that server."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.config.backends import GCPBackend
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.errors import ProviderError
from dstack_plan.providers.capacity import CapacityError, create_first
from dstack_plan.providers.cloud_init import STARTUP_SCRIPT
from dstack_plan.providers.gcp.provider import GCPProvider
from dstack_plan.providers.offer_cache import OfferCache
from tests.infra.fake_gcp import FakeGCP, Refusal, service_account_file

pytestmark = pytest.mark.gcp
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG0ZBCf1w4R2Jv0V7l6C0y8Gf3yHkq3fGz1mX1uX0h4Z t@x"
REGION = "us-central1"


def _provider(gcp: FakeGCP, tmp_path: Path, **config: Any) -> GCPProvider:
    sa = service_account_file(tmp_path)
    cfg = GCPBackend.model_validate(
        {
            "type": "gcp",
            "project_id": "proj-1",
            "regions": [REGION],
            "credentials_file": str(sa),
            "endpoint": gcp.base_url,
            **config,
        }
    )
    cache = OfferCache(tmp_path / "gcp-offers.json")
    return GCPProvider(cfg, project="life", lineage="l1", ssh_public_key=KEY, cache=cache)


async def test_offers_are_the_catalogue_types_zones_offer_cheapest_first(
    gcp: FakeGCP, tmp_path: Path
) -> None:
    gcp.zones["us-central1-a"].remove("a2-ultragpu-8g")
    gcp.zones["us-central1-b"].remove("a2-ultragpu-8g")
    p = _provider(gcp, tmp_path)
    offers = await p.offers(ResourcesSpec.model_validate({"gpu": "A100"}))
    types = {o.instance_type for o in offers}
    assert types == {"a2-highgpu-1g", "a2-highgpu-8g", "a2-ultragpu-1g"}
    assert {o.region for o in offers} == {REGION}
    assert [o.price_per_hour for o in offers] == sorted(o.price_per_hour for o in offers)
    assert any(o.spot for o in offers) and any(not o.spot for o in offers)
    # authorized by a JWT the service account's key signed (Google's self-signed JWT access)
    listed = gcp.sent("GET", "/aggregated/machineTypes")
    assert len(listed) == 1
    claims = _jwt_claims(listed[0].headers["authorization"])
    assert claims["iss"] == "dstack-plan@proj-1.iam.gserviceaccount.com"

    # the zones are kept: a new provider (a new command) asks nothing
    again = _provider(gcp, tmp_path)
    assert await again.offers(ResourcesSpec.model_validate({"gpu": "A100"})) == offers
    assert len(gcp.sent("GET", "/aggregated/machineTypes")) == 1


async def test_lifecycle_of_a_spot_gpu_fleet(gcp: FakeGCP, tmp_path: Path) -> None:
    gcp.addresses[:] = ["10.213.0.12", "10.213.0.13"]
    p = _provider(gcp, tmp_path, tags={"team": "ml"})
    offer = next(
        o
        for o in await p.offers(ResourcesSpec.model_validate({"gpu": "A100:1"}))
        if o.spot and o.instance_type == "a2-highgpu-1g"
    )
    created = await p.create_instances("train", offer, 2)
    assert [i.name for i in created] == ["train-0", "train-1"]
    assert [i.hostname for i in created] == ["10.213.0.12", "10.213.0.13"]
    assert all(i.id.startswith("us-central1-a/train-") for i in created)

    bodies = gcp.inserted()
    assert len(bodies) == 2
    body = bodies[0]
    assert body["machineType"] == "zones/us-central1-a/machineTypes/a2-highgpu-1g"
    assert body["guestAccelerators"] == [
        {
            "acceleratorCount": 1,
            "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-a100",
        }
    ]
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["labels"] == {
        "dstack-plan-project": "life",
        "dstack-plan-lineage": "l1",
        "dstack-plan-fleet": "train",
        "team": "ml",
    }
    disk = body["disks"][0]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["diskSizeGb"] == "100"
    assert "deeplearning" in disk["initializeParams"]["sourceImage"]
    meta = {m["key"]: m["value"] for m in body["metadata"]["items"]}
    assert meta["ssh-keys"] == f"ubuntu:{KEY}"
    assert meta["startup-script"] == STARTUP_SCRIPT
    assert body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert body["tags"]["items"] == ["dstack-plan"]
    # the SSH firewall rule was made once, for the instances' network tag
    rule = gcp.firewalls["dstack-plan-life-ssh"]
    assert rule["targetTags"] == ["dstack-plan"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]

    fresh = await p.refresh(created)
    assert {i.status for i in fresh} == {"idle"}
    assert all(i.resources is not None and len(i.resources.gpus) == 1 for i in fresh)
    assert fresh[0].price_per_hour == offer.price_per_hour
    assert {i.id for i in await p.tagged_instances("train")} == {i.id for i in created}
    assert await p.tagged_instances("other") == []

    # scaling in place: the third node is counted after the first two, the rule is reused
    third = await p.create_instances("train", offer, 1)
    assert third[0].name == "train-2"
    assert len(gcp.sent("POST", "/global/firewalls")) == 1

    await p.terminate([*created, *third])
    assert await p.refresh([*created, *third]) == []
    assert await p.tagged_instances() == []
    await p.terminate(created)  # already gone: silent
    await p.close()


async def test_on_demand_cpu_machine_on_a_private_network(gcp: FakeGCP, tmp_path: Path) -> None:
    p = _provider(gcp, tmp_path, network="ml", subnetwork="ml-a", public_ips=False)
    offer = next(o for o in await p.offers() if o.instance_type == "e2-standard-4" and not o.spot)
    (inst,) = await p.create_instances("cpu", offer, 1)
    body = gcp.inserted()[0]
    assert "provisioningModel" not in body["scheduling"]
    assert "guestAccelerators" not in body
    assert "ubuntu-os-cloud" in body["disks"][0]["initializeParams"]["sourceImage"]
    nic = body["networkInterfaces"][0]
    assert nic["network"] == "global/networks/ml"
    assert nic["subnetwork"] == f"regions/{REGION}/subnetworks/ml-a"
    assert "accessConfigs" not in nic
    assert inst.hostname.startswith("10.128.0.")  # the private address


async def test_a_full_zone_falls_to_the_next_zone_then_the_next_offer(
    gcp: FakeGCP, tmp_path: Path
) -> None:
    p = _provider(gcp, tmp_path)
    offers = [o for o in await p.offers(ResourcesSpec.model_validate({"gpu": "L4"})) if not o.spot]
    cheapest, second = offers[0], offers[1]
    assert cheapest.instance_type == "g2-standard-4"
    # zone a is exhausted: the same offer goes to zone b
    gcp.refusals[("g2-standard-4", "us-central1-a")] = Refusal(
        "operation", "ZONE_RESOURCE_POOL_EXHAUSTED"
    )
    (inst,) = await p.create_instances("l4", cheapest, 1)
    assert inst.id.startswith("us-central1-b/")
    # quota in every zone of the cheapest: create_first takes the next offer
    gcp.refusals[("g2-standard-4", None)] = Refusal(
        "http", "quotaExceeded", 403, "Quota 'NVIDIA_L4_GPUS' exceeded. Limit: 1.0"
    )
    created = await create_first(lambda _: p, "l4", [cheapest, second], 1)
    assert created.offer == second
    assert created.refused == ["g2-standard-4 us-central1 on-demand: QUOTA_EXCEEDED"]
    # nothing half-made is left in the refusing zones
    assert {i.id.split("/")[0] for i in await p.tagged_instances("l4")} == {
        "us-central1-b",
        "us-central1-a",
    }
    assert len(await p.tagged_instances("l4")) == 2


async def test_availability_zones_choose_and_order_the_zones_tried(
    gcp: FakeGCP, tmp_path: Path
) -> None:
    p = _provider(gcp, tmp_path)
    offers = [o for o in await p.offers(ResourcesSpec.model_validate({"gpu": "L4"})) if not o.spot]
    offer = offers[0]
    # zone b is wanted first, and then a zone that does not offer the type (skipped)
    wanted = offer.model_copy(update={"zones": ("us-central1-b", "us-central1-z")})
    (inst,) = await p.create_instances("zl4", wanted, 1)
    assert inst.zone == "us-central1-b" and inst.id.startswith("us-central1-b/")
    gcp.refusals[("g2-standard-4", "us-central1-b")] = Refusal(
        "operation", "ZONE_RESOURCE_POOL_EXHAUSTED"
    )
    with pytest.raises(CapacityError):  # zone a has room, but it is not one of the fleet's
        await p.create_instances("zl4", wanted, 1)
    assert len(await p.tagged_instances("zl4")) == 1


async def test_a_refusal_that_is_not_about_capacity_fails_at_once(
    gcp: FakeGCP, tmp_path: Path
) -> None:
    p = _provider(gcp, tmp_path)
    offer = next(o for o in await p.offers() if o.instance_type == "n2-standard-8")
    gcp.refusals[("n2-standard-8", None)] = Refusal("operation", "RESOURCE_NOT_FOUND")
    with pytest.raises(ProviderError) as e:
        await create_first(lambda _: p, "f", [offer], 1)
    assert not isinstance(e.value, CapacityError)
    assert "RESOURCE_NOT_FOUND creating n2-standard-8 in us-central1-a" in str(e.value)
    assert len(gcp.inserted()) == 1  # not retried in the next zone


async def test_unknown_and_preempted_instances(gcp: FakeGCP, tmp_path: Path) -> None:
    p = _provider(gcp, tmp_path)
    offer = next(o for o in await p.offers() if o.instance_type == "e2-standard-4" and o.spot)
    (inst,) = await p.create_instances("s", offer, 1)
    gcp.preempt(inst.id.split("/")[1])
    assert await p.refresh([inst]) == []  # reclaimed: drift
    await p.terminate([inst])  # not found: silent


async def test_credential_problems_are_clear_and_hold_no_secret(
    gcp: FakeGCP, tmp_path: Path
) -> None:
    missing = _provider(gcp, tmp_path, credentials_file=str(tmp_path / "nope.json"))
    with pytest.raises(ProviderError, match="cannot read the service-account file"):
        await missing.offers()
    unreachable = _provider(gcp, tmp_path, endpoint="http://127.0.0.1:1")  # nothing listens
    with pytest.raises(ProviderError, match="cannot reach Compute Engine") as e:
        await unreachable.offers()
    assert "PRIVATE KEY" not in str(e.value)


def _jwt_claims(authorization: str) -> dict[str, Any]:
    scheme, _, token = authorization.partition(" ")
    assert scheme == "Bearer"
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))
