"""The `azure` provider through the real azure-mgmt-* clients, against a local fake of Azure
Resource Manager over HTTPS (tests/infra/fake_arm.py), its certificate trusted through
REQUESTS_CA_BUNDLE."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.config.backends import AzureBackend
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.errors import ProviderError
from dstack_plan.providers.azure.provider import AzureProvider
from dstack_plan.providers.capacity import CapacityError, create_first
from dstack_plan.providers.catalog import load_catalog
from dstack_plan.providers.cloud_init import STARTUP_SCRIPT
from dstack_plan.providers.offer_cache import OfferCache
from tests.infra.fake_arm import AZURE_VARS, SUBSCRIPTION, TOKEN, FakeARM, msi_env
from tests.infra.rest_server import RestServer, self_signed_cert

pytestmark = pytest.mark.azure
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG0ZBCf1w4R2Jv0V7l6C0y8Gf3yHkq3fGz1mX1uX0h4Z t@x"
REGION = "eastus"


class FakeCredential:
    """A TokenCredential that hands out a fixed token."""

    def get_token(self, *scopes: str, **kw: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("fake", int(time.time()) + 3600)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("arm-tls"))


@pytest.fixture
def arm(cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeARM]:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert[0]))
    for var in AZURE_VARS:  # nothing of the machine's own Azure setup may answer
        monkeypatch.delenv(var, raising=False)
    app = FakeARM()
    server = RestServer(app, tls=cert)
    yield app
    server.stop()


def _config(arm: FakeARM, **config: Any) -> AzureBackend:
    return AzureBackend.model_validate(
        {
            "type": "azure",
            "subscription_id": SUBSCRIPTION,
            "regions": [REGION],
            "arm_endpoint": arm.base_url,
            **config,
        }
    )


def _provider(arm: FakeARM, tmp_path: Path, *, credential: Any = None, **config: Any) -> Any:
    return AzureProvider(
        _config(arm, **config),
        project="life",
        lineage="l1",
        ssh_public_key=KEY,
        cache=OfferCache(tmp_path / "azure-offers.json"),
        credential=credential or FakeCredential(),
    )


def _a100_offers_in(regions: set[str], minus: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return {
        (i.instance_type, r)
        for i in load_catalog("azure").items
        if i.gpus and i.gpus.name == "A100"
        for r in i.regions
        if r in regions and (i.instance_type, r) not in minus
    }


async def test_offers_are_the_sizes_regions_have_cheapest_first(
    arm: FakeARM, tmp_path: Path
) -> None:
    arm.skus[REGION].remove("Standard_ND96asr_v4")
    arm.skus[REGION].remove("Standard_NC96ads_A100_v4")
    arm.restricted[REGION] = ["Standard_NC96ads_A100_v4"]  # listed, not for this subscription
    regions = [REGION, "westeurope"]
    p = _provider(arm, tmp_path, regions=regions)
    offers = await p.offers(ResourcesSpec.model_validate({"gpu": "A100"}))
    gone = {("Standard_ND96asr_v4", REGION), ("Standard_NC96ads_A100_v4", REGION)}
    assert {(o.instance_type, o.region) for o in offers} == _a100_offers_in(set(regions), gone)
    assert [o.price_per_hour for o in offers] == sorted(o.price_per_hour for o in offers)
    assert any(o.spot for o in offers) and any(not o.spot for o in offers)
    listed = arm.sent("GET", "/providers/Microsoft.Compute/skus")
    assert sorted(r.query["$filter"][0] for r in listed) == [
        "location eq 'eastus'",
        "location eq 'westeurope'",
    ]
    assert listed[0].headers["Authorization"] == "Bearer fake"

    # kept: neither this provider nor a new one (a new command) asks again
    assert await p.offers(ResourcesSpec.model_validate({"gpu": "A100"})) == offers
    again = _provider(arm, tmp_path, regions=regions)
    assert await again.offers(ResourcesSpec.model_validate({"gpu": "A100"})) == offers
    assert len(arm.sent("GET", "/skus")) == 2
    await p.close()


async def test_lifecycle_of_a_spot_fleet(arm: FakeARM, tmp_path: Path) -> None:
    arm.addresses[:] = ["203.0.113.10", "203.0.113.11"]
    p = _provider(arm, tmp_path, tags={"team": "ml"})
    offer = next(o for o in await p.offers(ResourcesSpec.model_validate({"gpu": "T4"})) if o.spot)

    created = await p.create_instances("f", offer, 2)
    assert [i.name for i in created] == ["f-0", "f-1"] and len({i.id for i in created}) == 2
    assert all(i.status == "provisioning" and i.id.startswith(i.name + "-") for i in created)
    tags = {
        "dstack-plan:project": "life",
        "dstack-plan:lineage": "l1",
        "team": "ml",
    }
    (group,) = arm.sent("PUT", "/resourcegroups/dstack-plan-life")
    assert group.body["location"] == REGION and group.body["tags"] == tags
    (vnet,) = arm.sent("PUT", "/virtualNetworks/dstack-plan-eastus")
    assert vnet.body["properties"]["subnets"][0]["name"] == "default"
    (nsg,) = arm.sent("PUT", "/networkSecurityGroups/dstack-plan-eastus-ssh")
    (rule,) = nsg.body["properties"]["securityRules"]
    assert rule["properties"]["destinationPortRange"] == "22"
    assert rule["properties"]["direction"] == "Inbound" and rule["properties"]["access"] == "Allow"
    assert vnet.body["tags"] == nsg.body["tags"] == tags

    puts = arm.vm_puts()
    assert len(puts) == 2
    for body, inst in zip(puts, created, strict=True):
        props = body["properties"]
        assert props["hardwareProfile"]["vmSize"] == offer.instance_type
        assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
        assert props["billingProfile"]["maxPrice"] == -1
        assert body["tags"] == {**tags, "dstack-plan:fleet": "f", "dstack-plan:name": inst.name}
        os_profile = props["osProfile"]
        assert os_profile["adminUsername"] == "ubuntu"
        (key,) = os_profile["linuxConfiguration"]["ssh"]["publicKeys"]
        assert key == {"path": "/home/ubuntu/.ssh/authorized_keys", "keyData": KEY}
        assert os_profile["linuxConfiguration"]["disablePasswordAuthentication"] is True
        assert base64.b64decode(os_profile["customData"]).decode() == STARTUP_SCRIPT
        disk = props["storageProfile"]["osDisk"]
        assert disk["diskSizeGB"] == 100 and disk["deleteOption"] == "Delete"
        assert props["storageProfile"]["imageReference"]["offer"] == "ubuntu-24_04-lts"
        (nic,) = props["networkProfile"]["networkInterfaceConfigurations"]
        assert nic["properties"]["deleteOption"] == "Delete"
        assert nic["properties"]["networkSecurityGroup"]["id"].endswith("/dstack-plan-eastus-ssh")
        (ipconfig,) = nic["properties"]["ipConfigurations"]
        public = ipconfig["properties"]["publicIPAddressConfiguration"]
        assert public["name"] == f"{inst.id}-ip" and public["sku"]["name"] == "Standard"
        assert ipconfig["properties"]["subnet"]["id"].endswith(
            "/dstack-plan-eastus/subnets/default"
        )

    # refresh completes the hostname with one list of VMs and one of addresses
    before = len(arm.requests)
    blank = [i.model_copy(update={"hostname": ""}) for i in created]
    refreshed = await p.refresh(blank)
    assert {i.status for i in refreshed} == {"idle"}
    assert sorted(i.hostname for i in refreshed) == ["203.0.113.10", "203.0.113.11"]
    assert all(
        i.resources is not None and i.price_per_hour == offer.price_per_hour for i in refreshed
    )
    assert len(arm.requests) - before == 2
    assert {i.id for i in await p.tagged_instances("f")} == {i.id for i in created}
    assert await p.tagged_instances("other") == []

    await p.terminate(created)
    deleted = arm.sent("DELETE", "/virtualMachines/")
    assert sorted(r.path.rsplit("/", 1)[1] for r in deleted) == sorted(i.id for i in created)
    assert not arm.sent("GET", "/publicIPAddresses/f-") and arm.vms() == []
    assert not [k for k in arm.resources if "/networkinterfaces/" in k or "/disks/" in k]
    await p.terminate(created)  # gone: silent, and nothing more is deleted
    assert len(arm.sent("DELETE")) == 2
    assert await p.refresh(created) == []
    assert await p.tagged_instances() == []
    await p.close()


async def test_on_demand_private_fleet(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path, public_ips=False, ssh_user="azureuser", resource_group="mine")
    offer = next(o for o in await p.offers() if not o.spot)
    (first,) = await p.create_instances("g", offer, 1)
    (second,) = await p.create_instances("g", offer, 1)
    assert (first.name, second.name) == ("g-0", "g-1")
    assert first.hostname.startswith("10.0.0.") and first.hostname != second.hostname
    body = arm.vm_puts()[0]
    props = body["properties"]
    assert "priority" not in props and "evictionPolicy" not in props
    assert props["osProfile"]["adminUsername"] == "azureuser"
    (nic,) = props["networkProfile"]["networkInterfaceConfigurations"]
    assert "publicIPAddressConfiguration" not in nic["properties"]["ipConfigurations"][0].get(
        "properties", {}
    )
    assert arm.sent("PUT", "/resourceGroups/mine/providers/Microsoft.Compute/virtualMachines/")
    assert len(arm.sent("PUT", "/resourcegroups/mine")) == 1  # the group is made once
    assert [i.status for i in await p.refresh([first, second])] == ["idle", "idle"]
    await p.close()


async def test_an_existing_group_is_left_as_it_is(arm: FakeARM, tmp_path: Path) -> None:
    arm.resources[f"/subscriptions/{SUBSCRIPTION}/resourcegroups/shared"] = {
        "id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/shared",
        "name": "shared",
        "location": "westeurope",
        "properties": {"provisioningState": "Succeeded"},
    }
    p = _provider(arm, tmp_path, resource_group="shared")
    offer = next(o for o in await p.offers() if not o.spot)
    await p.create_instances("h", offer, 1)
    assert not arm.sent("PUT", "/resourcegroups/shared")
    await p.close()


async def test_eviction_and_deallocation(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    offer = next(o for o in await p.offers() if o.spot)
    evicted, stopped, running = await p.create_instances("e", offer, 3)
    arm.set_power(evicted.id, None)
    arm.set_power(stopped.id, "deallocated")
    assert [i.id for i in await p.refresh([evicted, stopped, running])] == [running.id]
    # a deallocated VM still holds its disk: destroy must find it, and delete it
    tagged = {i.id: i.status for i in await p.tagged_instances("e")}
    assert tagged == {stopped.id: "terminated", running.id: "idle"}
    await p.terminate([evicted, stopped, running])
    assert arm.vms() == []
    await p.close()


async def test_capacity_refusals_fall_through_to_the_next_offer(
    arm: FakeARM, tmp_path: Path
) -> None:
    p = _provider(arm, tmp_path)
    offers = [o for o in await p.offers() if not o.spot][:3]
    arm.fail_sizes[offers[0].instance_type] = (409, "SkuNotAvailable")
    arm.fail_sizes[offers[1].instance_type] = ("lro", "AllocationFailed")
    result = await create_first(lambda _: p, "g", offers, 1)
    assert result.offer == offers[2] and len(result.instances) == 1
    assert result.refused == [
        f"{offers[0].instance_type} {REGION} on-demand: SkuNotAvailable",
        f"{offers[1].instance_type} {REGION} on-demand: AllocationFailed",
    ]
    # the VM whose allocation failed was deleted: only the one created is left
    assert [v["name"] for v in arm.vms()] == [result.instances[0].id]

    arm.fail_sizes[offers[2].instance_type] = (409, "ZonalAllocationFailed")
    with pytest.raises(ProviderError) as e:
        await create_first(lambda _: p, "g", offers, 1)
    for code in ("SkuNotAvailable", "AllocationFailed", "ZonalAllocationFailed"):
        assert code in str(e.value)
    await p.close()


async def test_over_quota_mid_way_deletes_what_the_call_made(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    offer = next(o for o in await p.offers() if not o.spot)
    arm.quota[offer.instance_type] = 1
    with pytest.raises(CapacityError) as e:
        await p.create_instances("q", offer, 2)
    assert e.value.code == "OperationNotAllowed"
    assert len(arm.vm_puts()) == 2 and len(arm.sent("DELETE", "/virtualMachines/")) == 1
    assert arm.vms() == []
    await p.close()


async def test_other_errors_fail_at_once_and_leave_nothing(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    offers = [o for o in await p.offers() if not o.spot][:2]
    arm.fail_sizes[offers[0].instance_type] = (400, "InvalidParameter")
    with pytest.raises(ProviderError) as e:
        await create_first(lambda _: p, "g", offers, 2)
    assert not isinstance(e.value, CapacityError)
    assert "InvalidParameter" in str(e.value) and offers[0].instance_type in str(e.value)
    assert len(arm.vm_puts()) == 1 and arm.vms() == []  # the next offer was not tried

    arm.fail_sizes[offers[0].instance_type] = ("lro", "OSProvisioningClientError")
    with pytest.raises(ProviderError, match="OSProvisioningClientError"):
        await p.create_instances("g", offers[0], 1)
    assert arm.vms() == []
    await p.close()


async def test_unknown_machines(arm: FakeARM, tmp_path: Path) -> None:
    p = _provider(arm, tmp_path)
    offer = next(o for o in await p.offers() if not o.spot)
    (known,) = await p.create_instances("u", offer, 1)
    ghost = known.model_copy(update={"id": "u-9-abcdef", "name": "u-9"})
    assert [i.id for i in await p.refresh([ghost, known])] == [known.id]
    await p.terminate([ghost])
    assert not arm.sent("DELETE")
    await p.close()

    # no resource group at all: nothing is there, and that is no error
    q = _provider(arm, tmp_path, resource_group="never-made")
    assert await q.refresh([known]) == [] and await q.tagged_instances() == []
    await q.terminate([known])
    assert not arm.sent("DELETE")
    await q.close()


async def test_a_missing_secret_variable_is_named(
    arm: FakeARM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DSTACK_TEST_AZURE_SECRET", raising=False)
    cfg = _config(
        arm, tenant_id="t-1", client_id="app-1", client_secret_env="DSTACK_TEST_AZURE_SECRET"
    )
    p = AzureProvider(cfg, project="life")
    with pytest.raises(ProviderError, match="DSTACK_TEST_AZURE_SECRET is not set"):
        await p.offers()
    assert arm.requests == []


async def test_the_client_secret_never_shows_in_errors(
    arm: FakeARM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import azure.identity
    from azure.core.exceptions import ClientAuthenticationError

    secret = "s3cr3t-Value-9f8e7d"
    made: list[tuple[Any, ...]] = []

    class Refusing:
        """A ClientSecretCredential whose token request Entra ID refuses, echoing the
        secret (the provider must not pass it on)."""

        def __init__(self, *args: Any, **kw: Any) -> None:
            made.append(args)

        def get_token(self, *scopes: str, **kw: Any) -> Any:
            raise ClientAuthenticationError(f"AADSTS7000215: Invalid client secret {secret}")

    monkeypatch.setattr(azure.identity, "ClientSecretCredential", Refusing)
    monkeypatch.setenv("DSTACK_TEST_AZURE_SECRET", secret)
    cfg = _config(
        arm, tenant_id="t-1", client_id="app-1", client_secret_env="DSTACK_TEST_AZURE_SECRET"
    )
    p = AzureProvider(cfg, project="life")
    with pytest.raises(ProviderError) as e:
        await p.offers()
    assert made == [("t-1", "app-1", secret)]
    assert "no Azure credentials" in str(e.value) and "AADSTS7000215" in str(e.value)
    assert secret not in str(e.value) and secret not in repr(e.value)
    assert e.value.__cause__ is None and e.value.__suppress_context__

    # an error from ARM itself does not show it either
    p = _provider(arm, tmp_path, tenant_id="t-1", client_id="app-1", client_secret_env="X")
    arm.fail_sizes["Standard_D4s_v5"] = (400, "InvalidParameter")
    offer = next(o for o in await p.offers() if o.instance_type == "Standard_D4s_v5")
    with pytest.raises(ProviderError) as e:
        await p.create_instances("s", offer, 1)
    assert secret not in str(e.value)


async def test_no_credentials_is_a_provider_error(
    arm: FakeARM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The instance metadata endpoint is the fake's (a VM without an identity), and there is
    # no az CLI: DefaultAzureCredential finds nothing.
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", arm.base_url)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "no-az"))
    monkeypatch.setenv("PATH", str(tmp_path))
    p = AzureProvider(_config(arm), project="life")
    with pytest.raises(ProviderError, match="no Azure credentials") as e:
        await p.offers()
    assert e.value.provider == "azure"
    assert arm.sent("GET", "/metadata/identity/oauth2/token") and not arm.sent("GET", "/skus")


async def test_default_credential_from_a_managed_identity_in_the_environment(
    arm: FakeARM, cert: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a `dstack` subprocess needs: no `credential=`, only environment variables."""
    for var, value in msi_env(arm, cert[0]).items():
        monkeypatch.setenv(var, value)
    p = AzureProvider(_config(arm), project="life", cache=OfferCache(tmp_path / "c.json"))
    offers = await p.offers(ResourcesSpec.model_validate({"gpu": "A100"}))
    assert offers and {o.region for o in offers} == {REGION}
    (token,) = arm.sent("GET", "/msi/token")
    assert token.query["resource"] == [arm.base_url]
    assert token.headers["X-IDENTITY-HEADER"] == "fake-identity-header"
    assert arm.sent("GET", "/skus")[0].headers["Authorization"] == f"Bearer {TOKEN}"
    await p.close()


def test_agent_is_not_the_providers() -> None:
    import asyncio

    from dstack_plan.providers.base import Instance

    inst = Instance(provider="azure", id="x", name="x", fleet="f", hostname="")
    with pytest.raises(ProviderError, match="SSH"):
        asyncio.run(AzureProvider().agent(inst))


def test_import_does_not_import_the_sdk() -> None:
    code = (
        "import dstack_plan.providers.azure.provider as m, sys\n"
        "m.AzureProvider(None)\n"
        "assert not [n for n in sys.modules if n.startswith('azure')], sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
