"""The `azure` provider: Azure VMs for cloud fleets, through the azure-mgmt-* clients.

Offers come from the shipped catalogue narrowed to the VM sizes the Compute SKU list says a
region has for this subscription. Everything lives in one resource group (the configured one,
else `dstack-plan-<project>`) with, per region, a virtual network `dstack-plan-<region>` and a
security group `dstack-plan-<region>-ssh` that lets SSH in; fleets share these, so terminating
machines keeps them. Each VM declares its NIC and public IP inline with `deleteOption: Delete`,
so deleting the VM deletes them and its OS disk too. The SDKs are imported only inside methods
(constructing the provider does no I/O) and their calls block, so they run in
`asyncio.to_thread`. The agent is installed over SSH afterwards, as for SSH fleets; the custom
data only makes sure docker runs. Volumes are managed disks (`disks.py`).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import re
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dstack_plan.errors import ProviderError
from dstack_plan.providers.azure.arm import arm_model, capacity_code
from dstack_plan.providers.azure.disks import ManagedDisks
from dstack_plan.providers.base import Instance, Offer
from dstack_plan.providers.capabilities import ProviderWithPrices, ProviderWithTags
from dstack_plan.providers.capacity import CapacityError
from dstack_plan.providers.catalog import ROOT_DISK_GB, RegionPrice, catalog_offers
from dstack_plan.providers.catalogued import CataloguedProvider
from dstack_plan.providers.cloud_init import STARTUP_SCRIPT
from dstack_plan.providers.matching import offer_mismatch
from dstack_plan.providers.offer_cache import OfferCache

if TYPE_CHECKING:
    from dstack_plan.agent.client import AgentClient
    from dstack_plan.config.backends import AzureBackend
    from dstack_plan.config.resources import ResourcesSpec

T = TypeVar("T")
NAME = "azure"
IMAGE = {
    "publisher": "Canonical",
    "offer": "ubuntu-24_04-lts",
    "sku": "server",
    "version": "latest",
}
_POWER = {
    "starting": "provisioning",
    "running": "idle",
    "stopping": "terminating",
    "deallocating": "terminating",
}
_TAG = "dstack-plan:"


def _code(e: Any) -> str:
    return str(getattr(getattr(e, "error", None), "code", None) or "")


def _status(vm: Any) -> str | None:
    """What a VM is for the contract; None when no machine runs (stopped, deallocated, failed):
    the resource and its disk remain, but nothing is there to use."""
    state = str(vm.provisioning_state or "").lower()
    codes = [str(s.code) for s in getattr(vm.instance_view, "statuses", None) or []]
    power = next((c.split("/", 1)[1].lower() for c in codes if c.startswith("PowerState/")), None)
    if state == "deleting":
        return "terminating"
    if power in _POWER:
        return _POWER[power]
    return None if power is not None or state == "failed" else "provisioning"


class AzureProvider(CataloguedProvider, ProviderWithTags, ProviderWithPrices, ManagedDisks):
    """Azure VMs (and managed disks) tagged with this project (and lineage), in one resource
    group."""

    name = NAME
    config: AzureBackend | None

    def __init__(
        self,
        config: AzureBackend | None = None,
        *,
        project: str = "default",
        lineage: str = "",
        ssh_public_key: str | None = None,
        cache: OfferCache | None = None,
        catalog_file: Path | None = None,
        credential: Any = None,
    ):
        super().__init__(
            config,
            project=project,
            lineage=lineage,
            ssh_public_key=ssh_public_key,
            cache=cache,
            catalog_file=catalog_file,
        )
        self.credential = credential
        """A TokenCredential to use; None: built from the config when first needed."""
        self._own_credential: Any = None
        self._clients: dict[str, Any] = {}
        self._offered: dict[str, frozenset[str]] = {}
        self._networks: dict[str, tuple[str, str]] = {}
        self._group_ready = False

    # -- plumbing

    @property
    def resource_group(self) -> str:
        """The group everything is created in."""
        configured = self.config.resource_group if self.config else None
        return configured or f"dstack-plan-{self.project}"

    def _credential(self) -> Any:
        if self.credential is not None:
            return self.credential
        if self._own_credential is None:
            cfg = self.config
            if cfg is not None and cfg.client_id and cfg.client_secret_env:
                from azure.identity import ClientSecretCredential

                secret = os.environ.get(cfg.client_secret_env)
                if not secret:
                    raise ProviderError(
                        NAME, f"the client secret variable {cfg.client_secret_env} is not set"
                    )
                if not cfg.tenant_id:
                    raise ProviderError(NAME, "client_id needs tenant_id in .dstack/backends.yml")
                self._own_credential = ClientSecretCredential(cfg.tenant_id, cfg.client_id, secret)
            else:
                from azure.identity import DefaultAzureCredential

                self._own_credential = DefaultAzureCredential()
        return self._own_credential

    def client(self, kind: str) -> Any:
        """The `compute`, `network` or `resource` management client (kept until `close`)."""
        if kind not in self._clients:
            if self.config is None:
                raise ProviderError(NAME, "no azure backend in .dstack/backends.yml")
            if kind == "compute":
                from azure.mgmt.compute import ComputeManagementClient as cls
            elif kind == "network":
                from azure.mgmt.network import NetworkManagementClient as cls  # type: ignore[assignment]
            else:
                from azure.mgmt.resource.resources import (  # type: ignore[assignment]
                    ResourceManagementClient as cls,
                )
            kw: dict[str, Any] = {}
            if self.config.arm_endpoint:
                endpoint = self.config.arm_endpoint.rstrip("/")
                kw = {"base_url": endpoint, "credential_scopes": [f"{endpoint}/.default"]}
            self._clients[kind] = cls(self._credential(), self.config.subscription_id, **kw)
        return self._clients[kind]

    def _clean(self, text: str) -> str:
        """The first line of an SDK message (DefaultAzureCredential's next ones list every
        credential it tried), with the client secret out should it appear."""
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:300]
        var = self.config.client_secret_env if self.config else None
        secret = os.environ.get(var) if var else None
        return line.replace(secret, "***") if secret else line

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run a blocking SDK call off the loop; credential and network failures become a
        ProviderError (without secrets). Other HttpResponseErrors pass for the caller."""
        from azure.core import exceptions as ax

        try:
            return await asyncio.to_thread(fn)
        except ax.ClientAuthenticationError as e:
            if e.status_code is not None:  # ARM's 401, not a credential that found nothing
                raise ProviderError(NAME, f"Azure refused the credentials: {_code(e)}") from None
            raise ProviderError(
                NAME,
                f"no Azure credentials: {self._clean(e.message)} (use `az login`, a managed "
                "identity, or client_id and client_secret_env in .dstack/backends.yml)",
            ) from None
        except (ax.ServiceRequestError, ax.ServiceResponseError) as e:
            raise ProviderError(
                NAME, f"cannot reach Azure Resource Manager: {type(e).__name__}"
            ) from None

    def _failure(self, e: Any, doing: str) -> ProviderError:
        """An ARM error as a ProviderError naming its code, and its message's first line."""
        message = self._clean(str(getattr(e.error, "message", "") or ""))
        return ProviderError(NAME, f"{_code(e) or e.status_code} {doing}: {message}")

    async def _api(self, fn: Callable[[], T], doing: str) -> T:
        """`_call`, with any ARM error a ProviderError (`_failure`)."""
        from azure.core import exceptions as ax

        try:
            return await self._call(fn)
        except ax.HttpResponseError as e:
            raise self._failure(e, doing) from None

    def _tags(self, **extra: str) -> dict[str, str]:
        tags = {f"{_TAG}project": self.project, f"{_TAG}lineage": self.lineage}
        tags.update({f"{_TAG}{k}": v for k, v in extra.items()})
        if self.config is not None:
            tags.update(self.config.tags)
        return tags

    # -- offers

    async def _offered_sizes(self, region: str) -> frozenset[str]:
        if region not in self._offered:
            kept = self.cache.get(f"skus:{region}")
            if kept is not None:  # no round trip (nor SDK) while the cache holds
                self._offered[region] = frozenset(kept)
                return self._offered[region]
            compute = self.client("compute")

            def fetch() -> frozenset[str]:
                skus = compute.resource_skus.list(filter=f"location eq '{region}'")
                return frozenset(
                    str(s.name)
                    for s in skus
                    if s.resource_type == "virtualMachines"
                    and region.lower() in [str(loc).lower() for loc in s.locations or []]
                    # a Zone restriction leaves other zones; a Location one the whole region
                    and not any(r.type == "Location" for r in s.restrictions or [])
                )

            self._offered[region] = await self._api(fetch, f"listing VM sizes in {region}")
            self.cache.put(f"skus:{region}", list(self._offered[region]))
        return self._offered[region]

    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        """Catalogue offers of the configured regions whose size the region has, cheapest
        first."""
        regions = self.regions()
        sizes = await asyncio.gather(*(self._offered_sizes(r) for r in regions))
        offered = dict(zip(regions, sizes, strict=True))
        out = [
            o
            for o in catalog_offers(NAME, regions, override=self.catalog_file)
            if o.instance_type in offered[o.region]
        ]
        if requirements is not None:
            out = [o for o in out if offer_mismatch(requirements, o.resources) is None]
        return out

    # -- create

    async def _ensure_group(self, region: str) -> None:
        from azure.core import exceptions as ax

        if self._group_ready:
            return
        groups = self.client("resource").resource_groups
        rg = self.resource_group
        try:
            # GET first: an existing group keeps its location and tags (both its owner's)
            await self._call(lambda: groups.get(rg))
        except ax.ResourceNotFoundError:
            body = {"location": region, "tags": self._tags()}
            await self._api(lambda: groups.create_or_update(rg, body), f"creating group {rg}")
        self._group_ready = True

    async def _ensure(self, ops: Any, name: str, body: Any) -> Any:
        """The network resource `name`, created from `body` when absent."""
        from azure.core import exceptions as ax

        rg = self.resource_group
        try:
            return await self._call(lambda: ops.get(rg, name))
        except ax.ResourceNotFoundError:
            poller = await self._api(
                lambda: ops.begin_create_or_update(rg, name, body), f"creating {name}"
            )
            return await self._api(poller.result, f"creating {name}")

    async def _network(self, region: str) -> tuple[str, str]:
        """The subnet and security group ids of `region`, made on first use."""
        if region not in self._networks:
            from azure.mgmt.network import models as nm

            network, tags = self.client("network"), self._tags()
            vnet = await self._ensure(
                network.virtual_networks,
                f"dstack-plan-{region}",
                arm_model(
                    nm.VirtualNetwork,
                    location=region,
                    tags=tags,
                    address_space=nm.AddressSpace(address_prefixes=["10.0.0.0/16"]),
                    subnets=[arm_model(nm.Subnet, name="default", address_prefix="10.0.0.0/16")],
                ),
            )
            ssh = arm_model(
                nm.SecurityRule,
                name="ssh",
                protocol="Tcp",
                direction="Inbound",
                access="Allow",
                priority=1000,
                source_address_prefix="*",
                source_port_range="*",
                destination_address_prefix="*",
                destination_port_range="22",
            )
            nsg = await self._ensure(
                network.network_security_groups,
                f"dstack-plan-{region}-ssh",
                arm_model(
                    nm.NetworkSecurityGroup, location=region, tags=tags, security_rules=[ssh]
                ),
            )
            self._networks[region] = (f"{vnet.id}/subnets/default", str(nsg.id))
        return self._networks[region]

    def _vm(self, name: str, label: str, fleet: str, offer: Offer, net: tuple[str, str]) -> Any:
        from azure.mgmt.compute import models as cm

        assert self.config is not None and self.ssh_public_key is not None
        user = self.config.ssh_user
        public = None
        if self.config.public_ips:
            public = arm_model(
                cm.VirtualMachinePublicIPAddressConfiguration,
                name=f"{name}-ip",
                delete_option="Delete",
                sku=cm.PublicIPAddressSku(name="Standard", tier="Regional"),
                public_ip_allocation_method="Static",
            )
        ipconfig = arm_model(
            cm.VirtualMachineNetworkInterfaceIPConfiguration,
            name="ipconfig",
            primary=True,
            subnet=cm.SubResource(id=net[0]),
            public_ip_address_configuration=public,
        )
        nic = arm_model(
            cm.VirtualMachineNetworkInterfaceConfiguration,
            name=f"{name}-nic",
            primary=True,
            delete_option="Delete",
            network_security_group=cm.SubResource(id=net[1]),
            ip_configurations=[ipconfig],
        )
        key = cm.SshPublicKey(
            path=f"/home/{user}/.ssh/authorized_keys", key_data=self.ssh_public_key
        )
        spot: dict[str, Any] = {}
        if offer.spot:  # evicted means deleted; the bid is the on-demand price (-1)
            spot = {"priority": "Spot", "eviction_policy": "Delete"}
            spot["billing_profile"] = cm.BillingProfile(max_price=-1)
        return arm_model(
            cm.VirtualMachine,
            location=offer.region,
            tags=self._tags(fleet=fleet, name=label),
            hardware_profile=cm.HardwareProfile(vm_size=offer.instance_type),
            storage_profile=cm.StorageProfile(
                image_reference=cm.ImageReference(**IMAGE),
                os_disk=cm.OSDisk(
                    create_option="FromImage",
                    disk_size_gb=int(ROOT_DISK_GB),
                    delete_option="Delete",
                    managed_disk=cm.ManagedDiskParameters(storage_account_type="Premium_LRS"),
                ),
            ),
            os_profile=cm.OSProfile(
                computer_name=name,
                admin_username=user,
                custom_data=base64.b64encode(STARTUP_SCRIPT.encode()).decode(),
                linux_configuration=cm.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=cm.SshConfiguration(public_keys=[key]),
                ),
            ),
            network_profile=cm.NetworkProfile(
                network_api_version="2020-11-01", network_interface_configurations=[nic]
            ),
            **spot,
        )

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        """Create `count` VMs of `offer` and wait for each one's operation: Azure reports
        AllocationFailed and the like there, not when it accepts the request, so this takes
        as long as a VM takes to be provisioned (a minute or two; the VMs are created in
        parallel). CapacityError on no capacity or quota. On any error, the VMs this call
        made are deleted (without waiting) before it raises."""
        from azure.core import exceptions as ax

        if self.ssh_public_key is None:
            raise ProviderError(NAME, "no SSH key to give the machines")
        await self._ensure_group(offer.region)
        net = await self._network(offer.region)
        start = len(await self._tagged(fleet))
        vms = self.client("compute").virtual_machines
        rg = self.resource_group
        labels = [f"{fleet}-{start + n}" for n in range(count)]
        stem = [re.sub(r"[^a-z0-9-]+", "-", label.lower()).strip("-")[:56] for label in labels]
        names = [f"{s or 'vm'}-{secrets.token_hex(3)}" for s in stem]
        pollers: list[tuple[str, Any]] = []
        error: ax.HttpResponseError | None = None
        for name, label in zip(names, labels, strict=True):
            body = self._vm(name, label, fleet, offer, net)
            try:
                begin = functools.partial(vms.begin_create_or_update, rg, name, body)
                pollers.append((name, await self._call(begin)))
            except ax.HttpResponseError as e:
                error = e
                break
        made: list[Any] = []
        for _, poller in pollers:  # every started one finishes before any is deleted
            try:
                made.append(await self._call(poller.result))
            except ax.HttpResponseError as e:
                error = error or e
        if error is not None:
            for name, _ in pollers:
                await self._delete(name)
            code = capacity_code(error)
            if code is not None:
                raise CapacityError(NAME, code, offer) from None
            raise self._failure(error, f"creating {offer.instance_type} in {offer.region}")
        addresses = await self._addresses()
        return [self._instance(vm, "provisioning", addresses.get(vm.name, "")) for vm in made]

    # -- read / terminate

    async def _list(self) -> list[Any]:
        """Every VM of the resource group with its instance view, in one request ([] when
        there is no group)."""
        from azure.core import exceptions as ax

        vms = self.client("compute").virtual_machines
        rg = self.resource_group
        try:
            return await self._call(lambda: list(vms.list(rg, expand="instanceView")))
        except ax.ResourceNotFoundError:
            return []
        except ax.HttpResponseError as e:
            raise self._failure(e, f"listing VMs in {rg}") from None

    async def _addresses(self) -> dict[str, str]:
        """Each VM's address by VM name, public or private as configured, in one request:
        of the public IPs (`<vm>-ip`) or of the NICs (`<vm>-nic`) of the group."""
        network, rg = self.client("network"), self.resource_group
        public = self.config is None or self.config.public_ips
        ops = network.public_ip_addresses if public else network.network_interfaces
        suffix = "-ip" if public else "-nic"
        out: dict[str, str] = {}
        for item in await self._api(lambda: list(ops.list(rg)), f"listing addresses in {rg}"):
            configs = [] if public else item.ip_configurations or []
            address = item.ip_address if public else configs and configs[0].private_ip_address
            if str(item.name).endswith(suffix) and address:
                out[str(item.name)[: -len(suffix)]] = str(address)
        return out

    def _instance(self, vm: Any, status: str, hostname: str) -> Instance:
        tags = dict(vm.tags or {})
        size = str(vm.hardware_profile.vm_size) if vm.hardware_profile else ""
        item = self.catalog().item(size)
        region = str(vm.location)
        price = 0.0
        if item and region in item.regions:
            p = item.regions[region]
            price = (p.spot or p.on_demand) if vm.priority == "Spot" else p.on_demand
        return Instance(
            provider=NAME,
            id=str(vm.name),
            name=tags.get(f"{_TAG}name", str(vm.name)),
            fleet=tags.get(f"{_TAG}fleet", ""),
            hostname=hostname,
            region=region,
            resources=item.resources() if item else None,
            price_per_hour=price,
            status=status,  # type: ignore[arg-type]
        )

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        """The instances as Azure sees them now; deleted, stopped, deallocated (an evicted
        spot VM with another policy) or failed ones left out. One list of the group's VMs,
        and one of addresses when some hostname is not known yet."""
        known = {i.id: i.hostname for i in instances}
        live = [(vm, s) for vm in await self._list() if vm.name in known and (s := _status(vm))]
        addresses = await self._addresses() if any(not known[vm.name] for vm, _ in live) else {}
        return [
            self._instance(vm, s, known[vm.name] or addresses.get(vm.name, "")) for vm, s in live
        ]

    async def _delete(self, name: str) -> None:
        from azure.core import exceptions as ax

        vms = self.client("compute").virtual_machines
        # polling=False: accepted is enough, and no poller thread outlives the command
        delete = functools.partial(vms.begin_delete, self.resource_group, name, polling=False)
        try:
            await self._call(delete)
        except ax.ResourceNotFoundError:
            pass
        except ax.HttpResponseError as e:
            raise self._failure(e, f"deleting {name}") from None

    async def terminate(self, instances: Sequence[Instance]) -> None:
        """Delete each VM (its NIC, public IP and disk go with it) without waiting; one gone
        or already deleting is silent. The group, network and security group stay."""
        ids = {i.id for i in instances}
        for vm in await self._list():
            if vm.name in ids and str(vm.provisioning_state or "").lower() != "deleting":
                await self._delete(str(vm.name))

    async def _tagged(self, fleet: str | None) -> list[Any]:
        wanted = {f"{_TAG}project": self.project}
        if self.lineage:
            wanted[f"{_TAG}lineage"] = self.lineage
        if fleet is not None:
            wanted[f"{_TAG}fleet"] = fleet
        return [
            vm
            for vm in await self._list()
            if all((vm.tags or {}).get(k) == v for k, v in wanted.items())
        ]

    async def tagged_instances(self, fleet: str | None = None) -> list[Instance]:
        """Every VM of this project (and lineage) in the resource group, for destroy and drift
        checks; a stopped, deallocated or failed one too (its disk still costs), with status
        `terminated`."""
        vms = await self._tagged(fleet)
        addresses = await self._addresses() if vms else {}
        return [
            self._instance(vm, _status(vm) or "terminated", addresses.get(str(vm.name), ""))
            for vm in vms
        ]

    async def current_prices(
        self, types: Sequence[str], regions: Sequence[str]
    ) -> dict[tuple[str, str], RegionPrice]:
        """Today's pay-as-you-go and spot prices of `types` in `regions`, from the public
        Azure Retail Prices API (`prices_endpoint`), for `dstack catalog refresh`."""
        from dstack_plan.providers.azure.pricing import PRICES_URL, fetch_region

        base = (self.config.prices_endpoint if self.config else None) or PRICES_URL
        out: dict[tuple[str, str], RegionPrice] = {}
        for region in regions:
            found = await asyncio.to_thread(fetch_region, base, types, region)
            out.update({(size, region): price for size, price in found.items()})
        return out

    async def agent(self, instance: Instance) -> AgentClient:
        """Not here: a booted VM is a host of its fleet, reached over SSH like an SSH fleet's
        (`fleets/cloud.py`)."""
        raise ProviderError(NAME, "azure instances are reached through their fleet's SSH hosts")

    async def close(self) -> None:
        """Close the clients (and a credential this provider built); the next call reopens."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        if self._own_credential is not None and hasattr(self._own_credential, "close"):
            self._own_credential.close()
        self._own_credential = None
        self._group_ready = False
        self._networks.clear()
