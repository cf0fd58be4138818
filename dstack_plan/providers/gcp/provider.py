"""The `gcp` provider: Compute Engine instances for cloud fleets, through google-cloud-compute.

Offers come from the shipped catalogue narrowed to the zones that offer each machine type
(one aggregated list, kept in the offer cache). The SDK is imported only inside methods and
its calls block, so they run in `asyncio.to_thread`. An instance is created in the first zone
of its region that has capacity: Compute Engine reports a full zone only when the insert
operation ends, so `create_instances` waits for it (seconds) before answering. Labels (GCP's
tags) carry the project, fleet and lineage; a firewall rule per project opens SSH to the
instances it targets. The agent is installed over SSH afterwards, as for SSH fleets.
`dstack catalog refresh` prices the catalogue from the Cloud Billing catalogue
(`gcp/pricing.py`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dstack_plan.errors import ProviderError
from dstack_plan.providers.base import Instance, Offer
from dstack_plan.providers.capabilities import ProviderWithPrices, ProviderWithTags
from dstack_plan.providers.capacity import CapacityError
from dstack_plan.providers.catalog import ROOT_DISK_GB, RegionPrice, catalog_offers
from dstack_plan.providers.catalogued import CataloguedProvider
from dstack_plan.providers.cloud_init import STARTUP_SCRIPT
from dstack_plan.providers.gcp.disks import PersistentDisks
from dstack_plan.providers.gcp.names import label, vm_name
from dstack_plan.providers.matching import offer_mismatch
from dstack_plan.providers.offer_cache import OfferCache

if TYPE_CHECKING:
    from dstack_plan.agent.client import AgentClient
    from dstack_plan.config.backends import GCPBackend
    from dstack_plan.config.resources import ResourcesSpec

T = TypeVar("T")
NAME = "gcp"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
GPU_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu123-ubuntu-2204"
"""Deep Learning VM images install the NVIDIA driver at first boot when asked to."""
NETWORK_TAG = "dstack-plan"
"""The network tag the SSH firewall rule targets."""
ACCELERATORS = {
    "a2-highgpu": "nvidia-tesla-a100",
    "a2-ultragpu": "nvidia-a100-80gb",
    "a3-highgpu": "nvidia-h100-80gb",
    "g2-standard": "nvidia-l4",
}
"""The accelerator type of each GPU machine family (`a2-highgpu-8g` → `a2-highgpu`)."""
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "QUOTA_EXCEEDED",
        "UNSUPPORTED_OPERATION",
    }
)
"""Operation error codes that mean "not here, not now": try the next zone, then offer."""
_STATUS = {
    "PROVISIONING": "provisioning",
    "STAGING": "provisioning",
    "RUNNING": "idle",
    "STOPPING": "terminating",
    "SUSPENDING": "terminating",
}


def _tail(url: str) -> str:
    """The last part of a resource URL (`.../zones/us-central1-a` → `us-central1-a`)."""
    return url.rsplit("/", 1)[-1]


def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


class GCPProvider(CataloguedProvider, ProviderWithTags, PersistentDisks, ProviderWithPrices):
    """Compute Engine instances labelled with this project (and lineage)."""

    name = NAME
    config: GCPBackend

    def __init__(
        self,
        config: GCPBackend | None = None,
        *,
        project: str = "default",
        lineage: str = "",
        ssh_public_key: str | None = None,
        cache: OfferCache | None = None,
        catalog_file: Path | None = None,
        credentials: Any = None,
    ):
        if config is None:
            from dstack_plan.config.backends import GCPBackend

            config = GCPBackend(type="gcp", project_id=project)
        super().__init__(
            config,
            project=project,
            lineage=lineage,
            ssh_public_key=ssh_public_key,
            cache=cache,
            catalog_file=catalog_file,
        )
        self._credentials = credentials
        self._clients: dict[str, Any] = {}
        self._zones: dict[str, dict[str, list[str]]] | None = None

    # -- plumbing

    def _load_credentials(self) -> Any:
        if self._credentials is not None:
            return self._credentials
        path = self.config.credentials_file
        if path:
            from google.oauth2 import service_account

            try:
                self._credentials = service_account.Credentials.from_service_account_file(
                    path, scopes=SCOPES
                )
            except (OSError, ValueError) as e:
                raise ProviderError(
                    NAME, f"cannot read the service-account file {path}: {type(e).__name__}"
                ) from None
            return self._credentials
        import google.auth
        import google.auth.exceptions

        try:
            self._credentials, _ = google.auth.default(scopes=SCOPES)
        except google.auth.exceptions.DefaultCredentialsError:
            raise ProviderError(
                NAME, "no GCP credentials found (credentials_file or application default ones)"
            ) from None
        return self._credentials

    def client(self, kind: str) -> Any:
        """The REST client `compute_v1.<kind>Client` (`Instances`, `ZoneOperations`...), one
        of each, all with this backend's credentials and endpoint."""
        if kind not in self._clients:
            from google.cloud import compute_v1

            self._clients[kind] = self._rest_client(
                getattr(compute_v1, f"{kind}Client"), self.config.endpoint
            )
        return self._clients[kind]

    def _rest_client(self, cls: Any, endpoint: str | None) -> Any:
        """A google-cloud client of class `cls` over REST with this backend's credentials,
        sent to `endpoint` (None: the library's own)."""
        from google.api_core.client_options import ClientOptions

        options = ClientOptions(api_endpoint=endpoint)
        return cls(credentials=self._load_credentials(), transport="rest", client_options=options)

    async def _call(self, fn: Callable[[], T], api: str = "Compute Engine") -> T:
        """Run a blocking SDK call off the loop; credential and network failures become a
        ProviderError (without secrets). API errors pass for the caller to judge."""
        import google.auth.exceptions as gx
        import requests

        try:
            return await asyncio.to_thread(fn)
        except gx.RefreshError:
            raise ProviderError(NAME, "the GCP credentials were refused") from None
        except (gx.TransportError, requests.ConnectionError, requests.Timeout) as e:
            raise ProviderError(NAME, f"cannot reach {api}: {type(e).__name__}") from None

    async def _api(self, fn: Callable[[], T], doing: str, api: str = "Compute Engine") -> T:
        """`_call`, with any API error a ProviderError saying what failed."""
        from google.api_core import exceptions as gex

        try:
            return await self._call(fn, api)
        except gex.GoogleAPICallError as e:
            raise ProviderError(NAME, f"{api} error {e.code} {doing}") from None

    async def _wait(self, op: Any, zone: str | None) -> Any:
        """The operation `op` once done (zonal, or global when `zone` is None)."""
        from google.cloud import compute_v1

        done = compute_v1.Operation.Status.DONE
        ops = self.client("ZoneOperations" if zone else "GlobalOperations")
        where = {"zone": zone} if zone else {}
        while op.status != done:  # `wait` answers within two minutes, done or not
            wait = functools.partial(
                ops.wait, project=self.config.project_id, operation=op.name, **where
            )
            op = await self._api(wait, "waiting for an operation")
        return op

    def _labels(self, fleet: str | None) -> dict[str, str]:
        labels = {"dstack-plan-project": label(self.project)}
        if self.lineage:
            labels["dstack-plan-lineage"] = label(self.lineage)
        if fleet is not None:
            labels["dstack-plan-fleet"] = label(fleet)
        return labels

    # -- offers

    async def zones(self) -> dict[str, dict[str, list[str]]]:
        """region → machine type → the zones that offer it (catalogue types only)."""
        if self._zones is None:
            pairs = self.cache.get("zones")  # `zone/type`, one per machine type a zone offers
            if pairs is None:
                pairs = await self._api(self._zone_types, "listing machine types")
                self.cache.put("zones", pairs)
            zones: dict[str, dict[str, list[str]]] = {}
            for pair in sorted(pairs):
                zone, _, machine_type = pair.partition("/")
                zones.setdefault(_region_of(zone), {}).setdefault(machine_type, []).append(zone)
            self._zones = zones
        return self._zones

    def _zone_types(self) -> list[str]:
        """`zone/type` for each catalogue machine type each zone offers (one aggregated list,
        asked for those types only)."""
        types = {i.instance_type for i in self.catalog().items}
        wanted = " OR ".join(f'(name = "{t}")' for t in sorted(types))
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListMachineTypesRequest(
            project=self.config.project_id, filter=wanted
        )
        pages = self.client("MachineTypes").aggregated_list(request=request)
        return [
            f"{_tail(scope)}/{mt.name}"
            for scope, listed in pages
            for mt in listed.machine_types
            if mt.name in types
        ]

    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        """Catalogue offers of the configured regions that some zone there offers, cheapest
        first."""
        zones = await self.zones()
        out = [
            o
            for o in catalog_offers(NAME, self.regions(), override=self.catalog_file)
            if zones.get(o.region, {}).get(o.instance_type)
        ]
        if requirements is not None:
            out = [o for o in out if offer_mismatch(requirements, o.resources) is None]
        return out

    # -- create

    async def _firewall(self) -> None:
        """The project's rule letting SSH reach its instances, made once."""
        from google.api_core import exceptions as gex
        from google.cloud import compute_v1

        firewalls = self.client("Firewalls")
        name = f"dstack-plan-{label(self.project)}-ssh"[:63]
        project = self.config.project_id
        try:
            await self._call(lambda: firewalls.get(project=project, firewall=name))
            return
        except gex.NotFound:
            pass
        except gex.GoogleAPICallError as e:
            raise ProviderError(NAME, f"Compute Engine error {e.code} reading {name}") from None
        rule = compute_v1.Firewall(
            name=name,
            network=f"global/networks/{self.config.network or 'default'}",
            direction="INGRESS",
            source_ranges=["0.0.0.0/0"],
            target_tags=[NETWORK_TAG],
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
        )
        try:
            op = await self._call(
                lambda: firewalls.insert_unary(project=project, firewall_resource=rule)
            )
        except gex.Conflict:  # made meanwhile by another apply
            return
        except gex.GoogleAPICallError as e:
            raise ProviderError(NAME, f"Compute Engine error {e.code} creating {name}") from None
        await self._wait(op, None)

    def _instance_resource(self, fleet: str, offer: Offer, zone: str, name: str) -> Any:
        from google.cloud import compute_v1

        gpus = offer.resources.gpus
        metadata = [compute_v1.Items(key="startup-script", value=STARTUP_SCRIPT)]
        if self.ssh_public_key:
            key = f"{self.config.ssh_user}:{self.ssh_public_key}"
            metadata.append(compute_v1.Items(key="ssh-keys", value=key))
        if gpus:
            metadata.append(compute_v1.Items(key="install-nvidia-driver", value="True"))
        disk = compute_v1.AttachedDisk(
            boot=True,
            auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                disk_size_gb=int(ROOT_DISK_GB),
                source_image=GPU_IMAGE if gpus else IMAGE,
                disk_type=f"zones/{zone}/diskTypes/pd-balanced",
                labels=self._labels(fleet),
            ),
        )
        nic = compute_v1.NetworkInterface(
            network=f"global/networks/{self.config.network or 'default'}"
        )
        if self.config.subnetwork:
            nic.subnetwork = f"regions/{offer.region}/subnetworks/{self.config.subnetwork}"
        if self.config.public_ips:
            nic.access_configs = [compute_v1.AccessConfig(name="external", type_="ONE_TO_ONE_NAT")]
        scheduling = compute_v1.Scheduling(
            # GPU machines cannot live-migrate; spot ones are deleted when reclaimed
            on_host_maintenance="TERMINATE" if gpus or offer.spot else "MIGRATE",
            automatic_restart=not offer.spot,
        )
        if offer.spot:
            scheduling.provisioning_model = "SPOT"
            scheduling.instance_termination_action = "DELETE"
        accelerators = []
        family = offer.instance_type.rsplit("-", 1)[0]
        if gpus and family in ACCELERATORS:
            accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_count=len(gpus),
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{ACCELERATORS[family]}",
                )
            ]
        return compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{offer.instance_type}",
            disks=[disk],
            network_interfaces=[nic],
            guest_accelerators=accelerators,
            scheduling=scheduling,
            metadata=compute_v1.Metadata(items=metadata),
            labels={**self._labels(fleet), **self.config.tags},
            tags=compute_v1.Tags(items=[NETWORK_TAG]),
        )

    async def _insert(self, fleet: str, offer: Offer, zone: str, name: str) -> str | None:
        """Create one instance in `zone`; the capacity error code when the zone has none."""
        from google.api_core import exceptions as gex

        instances = self.client("Instances")
        resource = self._instance_resource(fleet, offer, zone, name)
        project = self.config.project_id
        try:
            op = await self._call(
                lambda: instances.insert_unary(
                    project=project, zone=zone, instance_resource=resource
                )
            )
        except gex.Forbidden as e:
            if "quota" in str(e.message).lower():
                return "QUOTA_EXCEEDED"
            raise ProviderError(NAME, f"Compute Engine refused {name}: {e.code}") from None
        except gex.GoogleAPICallError as e:
            raise ProviderError(
                NAME, f"Compute Engine error {e.code} creating {offer.instance_type} in {zone}"
            ) from None
        op = await self._wait(op, zone)
        errors = list(op.error.errors) if op.error else []
        if not errors:
            return None
        code = errors[0].code
        if code in CAPACITY_CODES:
            return str(code)
        raise ProviderError(NAME, f"{code} creating {offer.instance_type} in {zone}")

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        """`count` instances of `offer` in the first zone of its region (of its `zones`, in
        their order, when it names some) with room for all; CapacityError when none has.
        Waits for the insert operations (seconds)."""
        zones = (await self.zones()).get(offer.region, {}).get(offer.instance_type, [])
        if offer.zones is not None:
            zones = [z for z in offer.zones if z in zones]
        if not zones:
            raise CapacityError(NAME, "NOT_OFFERED", offer)
        await self._firewall()
        start = len(await self.tagged_instances(fleet))
        code = "NOT_OFFERED"
        for zone in zones:
            made: list[Instance] = []
            for n in range(start, start + count):
                name = vm_name(fleet, n)
                refused = await self._insert(fleet, offer, zone, name)
                if refused is not None:
                    code = refused
                    break
                made.append(
                    Instance(
                        provider=NAME,
                        id=f"{zone}/{name}",
                        name=f"{fleet}-{n}",
                        fleet=fleet,
                        hostname="",
                        region=offer.region,
                        zone=zone,
                        price_per_hour=offer.price_per_hour,
                        status="provisioning",
                    )
                )
            else:  # every id is returned, completed where a read already knows more
                known = {i.id: i for i in await self.refresh(made)}
                return [known.get(i.id, i) for i in made]
            await self.terminate(made)  # all in one zone, or none: try the next zone whole
        raise CapacityError(NAME, code, offer)

    # -- read / terminate

    def _instance(self, raw: Any) -> Instance | None:
        status = _STATUS.get(raw.status)
        if status is None:  # TERMINATED (stopped) or unknown: not a usable machine
            return None
        zone = _tail(raw.zone)
        labels = dict(raw.labels)
        item = self.catalog().item(_tail(raw.machine_type))
        region = _region_of(zone)
        spot = raw.scheduling.provisioning_model == "SPOT"
        price = 0.0
        if item and region in item.regions:
            p = item.regions[region]
            price = (p.spot or p.on_demand) if spot else p.on_demand
        nic = raw.network_interfaces[0] if raw.network_interfaces else None
        hostname = ""
        if nic is not None:
            public = [a.nat_i_p for a in nic.access_configs if a.nat_i_p]
            hostname = (public[0] if public else "") if self.config.public_ips else nic.network_i_p
        return Instance(
            provider=NAME,
            id=f"{zone}/{raw.name}",
            name=raw.name.rsplit("-", 1)[0],
            fleet=labels.get("dstack-plan-fleet", ""),
            hostname=hostname,
            region=region,
            zone=zone,
            resources=item.resources() if item else None,
            price_per_hour=price,
            status=status,  # type: ignore[arg-type]
        )

    async def _listed(self, zone: str) -> list[Any]:
        instances = self.client("Instances")
        return await self._api(
            lambda: list(instances.list(project=self.config.project_id, zone=zone)),
            f"listing instances in {zone}",
        )

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        """The instances as Compute Engine sees them now (one list per zone); deleted and
        stopped ones left out."""
        by_zone: dict[str, set[str]] = {}
        for i in instances:
            zone, _, name = i.id.partition("/")
            by_zone.setdefault(zone, set()).add(name)
        out: list[Instance] = []
        for zone, names in by_zone.items():
            raw = [r for r in await self._listed(zone) if r.name in names]
            out += [x for x in (self._instance(r) for r in raw) if x is not None]
        return out

    async def terminate(self, instances: Sequence[Instance]) -> None:
        """Delete each instance (its boot disk goes with it); already gone is silent."""
        from google.api_core import exceptions as gex

        client = self.client("Instances")
        project = self.config.project_id
        for i in instances:
            zone, _, name = i.id.partition("/")
            delete = functools.partial(
                client.delete_unary, project=project, zone=zone, instance=name
            )
            try:
                await self._call(delete)
            except gex.NotFound:
                continue
            except gex.GoogleAPICallError as e:
                raise ProviderError(
                    NAME, f"Compute Engine error {e.code} deleting {name}"
                ) from None

    async def tagged_instances(self, fleet: str | None = None) -> list[Instance]:
        """Every instance labelled with this project (and lineage, and `fleet` when given) in
        the configured regions, stopped ones included (destroy deletes them too)."""
        wanted = self._labels(fleet)
        query = " AND ".join(f'(labels.{k} = "{v}")' for k, v in wanted.items())
        regions = set(self.regions())
        client = self.client("Instances")

        def fetch() -> list[Any]:
            from google.cloud import compute_v1

            request = compute_v1.AggregatedListInstancesRequest(
                project=self.config.project_id, filter=query
            )
            pages = client.aggregated_list(request=request)
            return [i for _, listed in pages for i in listed.instances]

        out: list[Instance] = []
        for raw in await self._api(fetch, "listing instances"):
            labels = dict(raw.labels)
            if any(labels.get(k) != v for k, v in wanted.items()):
                continue
            if _region_of(_tail(raw.zone)) not in regions:
                continue
            found = self._instance(raw)
            if found is None:  # stopped: still there, still to delete
                zone = _tail(raw.zone)
                found = Instance(
                    provider=NAME,
                    id=f"{zone}/{raw.name}",
                    name=raw.name.rsplit("-", 1)[0],
                    fleet=labels.get("dstack-plan-fleet", ""),
                    hostname="",
                    region=_region_of(zone),
                    status="terminated",
                )
            out.append(found)
        return out

    # -- prices

    async def current_prices(
        self, types: Sequence[str], regions: Sequence[str]
    ) -> dict[tuple[str, str], RegionPrice]:
        """Today's on-demand and spot prices of `types` in `regions`, composed from the
        Compute Engine SKUs of the Cloud Billing Catalog API (`gcp/pricing.py`), for
        `dstack catalog refresh`."""
        from dstack_plan.providers.gcp import pricing

        if "billing" not in self._clients:
            try:
                from google.cloud import billing_v1
            except ImportError:  # an install of the `gcp` extra from before it needed it
                raise ProviderError(
                    NAME, "install the SDK first: pip install 'dstack-plan[gcp]'"
                ) from None
            self._clients["billing"] = self._rest_client(
                billing_v1.CloudCatalogClient,
                self.config.billing_endpoint or pricing.BILLING_ENDPOINT,
            )
        billing = self._clients["billing"]
        rates = await self._api(
            lambda: pricing.list_rates(billing, regions), "listing SKUs", "Cloud Billing"
        )
        wanted = set(types)
        items = [i for i in self.catalog().items if i.instance_type in wanted]
        return pricing.compose_prices(items, rates, regions)

    async def agent(self, instance: Instance) -> AgentClient:
        """Not here: a booted instance is a host of its fleet, reached over SSH like an SSH
        fleet's (`fleets/cloud.py`)."""
        raise ProviderError(NAME, "gcp instances are reached through their fleet's SSH hosts")

    async def close(self) -> None:
        """Drop the clients (closing their HTTP sessions)."""
        for client in self._clients.values():
            transport = getattr(client, "transport", None)
            if transport is not None:
                transport.close()
        self._clients.clear()
