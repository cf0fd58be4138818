"""The `aws` provider: EC2 instances for cloud fleets, through boto3.

Offers come from the shipped catalogue narrowed to what EC2 offers per region. boto3 is
imported only inside methods (constructing the provider does no I/O, and a CLI that never
touches AWS never pays boto3's import); its calls block, so they run in `asyncio.to_thread`.
The AMI is the newest image whose name looks like a Deep Learning/Ubuntu image, else the first
available one; the agent is installed over SSH afterwards, as for SSH fleets, so the user
data only makes sure docker runs.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dstack_plan.errors import ProviderError
from dstack_plan.providers.aws.ebs import EBSVolumes
from dstack_plan.providers.base import Instance, Offer
from dstack_plan.providers.capabilities import ProviderWithPrices, ProviderWithTags
from dstack_plan.providers.capacity import CapacityError
from dstack_plan.providers.catalog import RegionPrice, catalog_offers
from dstack_plan.providers.catalogued import CataloguedProvider
from dstack_plan.providers.cloud_init import STARTUP_SCRIPT
from dstack_plan.providers.matching import offer_mismatch
from dstack_plan.providers.offer_cache import OfferCache

if TYPE_CHECKING:
    from dstack_plan.agent.client import AgentClient
    from dstack_plan.config.backends import AWSBackend
    from dstack_plan.config.resources import ResourcesSpec

T = TypeVar("T")
NAME = "aws"
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "Unsupported",
    }
)
_STATUS = {
    "pending": "provisioning",
    "running": "idle",
    "stopping": "terminating",
    "shutting-down": "terminating",
}


def _code(e: BaseException) -> str:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code", ""))
    return ""


class AWSProvider(CataloguedProvider, ProviderWithTags, ProviderWithPrices, EBSVolumes):
    """EC2 instances tagged with this project (and lineage)."""

    name = NAME
    config: AWSBackend | None

    def __init__(
        self,
        config: AWSBackend | None = None,
        *,
        project: str = "default",
        lineage: str = "",
        ssh_public_key: str | None = None,
        endpoint_url: str | None = None,
        cache: OfferCache | None = None,
        catalog_file: Path | None = None,
    ):
        super().__init__(
            config,
            project=project,
            lineage=lineage,
            ssh_public_key=ssh_public_key,
            cache=cache,
            catalog_file=catalog_file,
        )
        self.endpoint_url = endpoint_url
        self._session: Any = None
        self._clients: dict[str, Any] = {}
        self._offered: dict[str, frozenset[str]] = {}

    # -- plumbing

    def client(self, region: str) -> Any:
        """The EC2 client for `region` (one per region, kept until `close`)."""
        if region not in self._clients:
            import boto3

            if self._session is None:
                profile = self.config.profile if self.config else None
                self._session = boto3.Session(profile_name=profile)
            self._clients[region] = self._session.client(
                "ec2", region_name=region, endpoint_url=self.endpoint_url
            )
        return self._clients[region]

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run a blocking boto3 call off the loop; credential and network failures become a
        ProviderError (without secrets). ClientErrors pass for the caller to judge."""
        import botocore.exceptions as bx

        try:
            return await asyncio.to_thread(fn)
        except bx.ClientError:
            raise
        except (bx.NoCredentialsError, bx.PartialCredentialsError):
            raise ProviderError(NAME, "no AWS credentials found (boto3 default chain)") from None
        except bx.ProfileNotFound as e:
            raise ProviderError(
                NAME, f"AWS profile not found: {e.kwargs.get('profile')}"
            ) from None
        except bx.BotoCoreError as e:
            raise ProviderError(NAME, f"cannot reach EC2: {type(e).__name__}") from None

    async def _api(self, fn: Callable[[], T], doing: str = "") -> T:
        """`_call`, with any ClientError a ProviderError naming its code (and `doing`)."""
        import botocore.exceptions as bx

        try:
            return await self._call(fn)
        except bx.ClientError as e:
            raise ProviderError(NAME, f"EC2 error {_code(e)} {doing}".rstrip()) from None

    def _tags(self, fleet: str, n: int) -> list[dict[str, str]]:
        tags = {
            "dstack-plan:project": self.project,
            "dstack-plan:fleet": fleet,
            "dstack-plan:lineage": self.lineage,
            "Name": f"{fleet}-{n}",
        }
        if self.config is not None:
            tags.update(self.config.tags)
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    # -- offers

    async def _offered_types(self, region: str) -> frozenset[str]:
        if region not in self._offered:
            kept = self.cache.get(f"offerings:{region}")
            if kept is not None:  # no round trip (nor boto3) while the cache holds
                self._offered[region] = frozenset(kept)
                return self._offered[region]
            ec2 = self.client(region)

            def fetch() -> frozenset[str]:
                pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
                    LocationType="region"
                )
                return frozenset(
                    o["InstanceType"] for p in pages for o in p["InstanceTypeOfferings"]
                )

            self._offered[region] = await self._api(fetch)
            self.cache.put(f"offerings:{region}", list(self._offered[region]))
        return self._offered[region]

    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        """Catalogue offers of the configured regions that EC2 offers there, cheapest first."""
        regions = self.regions()
        offered = {r: await self._offered_types(r) for r in regions}
        out = [
            o
            for o in catalog_offers(NAME, regions, override=self.catalog_file)
            if o.instance_type in offered[o.region]
        ]
        if requirements is not None:
            out = [o for o in out if offer_mismatch(requirements, o.resources) is None]
        return out

    # -- create

    async def _key_name(self, region: str) -> str | None:
        if self.ssh_public_key is None:
            return None
        import botocore.exceptions as bx

        key = self.ssh_public_key.encode()
        # named by the key too: a project whose key was made again must not get the old one
        name = f"dstack-plan-{self.project}-{hashlib.sha256(key).hexdigest()[:8]}"
        ec2 = self.client(region)
        try:
            await self._call(lambda: ec2.import_key_pair(KeyName=name, PublicKeyMaterial=key))
        except bx.ClientError as e:
            if _code(e) != "InvalidKeyPair.Duplicate":
                raise ProviderError(NAME, f"cannot import the SSH key: {_code(e)}") from None
        return name

    async def _security_group(self, region: str, subnet: str | None) -> str:
        name = f"dstack-plan-{self.project}"
        ec2 = self.client(region)
        filters = [{"Name": "group-name", "Values": [name]}]
        vpc = self.config.vpc_id if self.config else None
        if vpc:
            filters.append({"Name": "vpc-id", "Values": [vpc]})
        found = await self._api(lambda: ec2.describe_security_groups(Filters=filters))
        if found["SecurityGroups"]:
            return str(found["SecurityGroups"][0]["GroupId"])
        kw: dict[str, Any] = {"GroupName": name, "Description": "dstack-plan SSH access"}
        if vpc:
            kw["VpcId"] = vpc
        kw["TagSpecifications"] = [
            {
                "ResourceType": "security-group",
                "Tags": [{"Key": "dstack-plan:project", "Value": self.project}],
            }
        ]
        gid = str((await self._api(lambda: ec2.create_security_group(**kw)))["GroupId"])
        perm = [
            {
                "IpProtocol": "tcp",
                "FromPort": 22,
                "ToPort": 22,
                "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
            }
        ]
        await self._api(
            lambda: ec2.authorize_security_group_ingress(GroupId=gid, IpPermissions=perm)
        )
        return gid

    async def _image(self, region: str) -> str:
        ec2 = self.client(region)
        # Ask for the wanted names server-side first: Amazon's full image list is huge.
        dl = [{"Name": "name", "Values": ["Deep Learning*Ubuntu*"]}]
        images = (await self._api(lambda: ec2.describe_images(Owners=["amazon"], Filters=dl)))[
            "Images"
        ]
        if not images:
            images = (await self._api(lambda: ec2.describe_images(Owners=["amazon"])))["Images"]
        if not images:
            images = (await self._api(lambda: ec2.describe_images()))["Images"]
        if not images:
            raise ProviderError(NAME, f"no machine image found in {region}")
        wanted = [
            i for i in images if any(w in i.get("Name", "") for w in ("Deep Learning", "ubuntu"))
        ]
        pool = wanted or images[:1]
        pool.sort(key=lambda i: i.get("CreationDate", ""), reverse=True)
        return str(pool[0]["ImageId"])

    def _hostname(self, inst: dict[str, Any]) -> str:
        public = self.config.public_ips if self.config else True
        key = "PublicIpAddress" if public else "PrivateIpAddress"
        return str(inst.get(key) or "")

    async def _existing_count(self, region: str, fleet: str) -> int:
        return len([i for i in await self._tagged(region, fleet)])

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        """`run_instances` of `count` machines of `offer`, in the first of its `zones` with
        capacity (any zone when it names none); CapacityError on no capacity/quota."""
        region = offer.region
        subnets = (self.config.subnet_ids if self.config else None) or []
        subnet = subnets[0] if subnets else None
        zones: tuple[str | None, ...] = offer.zones or (None,)
        if subnets and offer.zones:
            # a subnet lies in one zone: the first configured one in a wanted zone
            subnet, zones = await self._subnet_in(region, subnets, offer.zones), (None,)
        refusal: CapacityError | None = None
        for zone in zones:
            try:
                return await self._run_instances(fleet, offer, count, subnet, zone)
            except CapacityError as e:
                refusal = e  # another zone may have room
        assert refusal is not None
        raise refusal

    async def _subnet_in(self, region: str, subnets: Sequence[str], zones: Sequence[str]) -> str:
        found = await self._api(
            functools.partial(self.client(region).describe_subnets, SubnetIds=list(subnets))
        )
        zone_of = {str(s["SubnetId"]): str(s["AvailabilityZone"]) for s in found["Subnets"]}
        for subnet in subnets:
            if zone_of.get(subnet) in zones:
                return subnet
        raise ProviderError(
            NAME,
            f"none of the configured subnets ({', '.join(subnets)}) is in the fleet's "
            f"availability_zones ({', '.join(zones)})",
        )

    async def _run_instances(
        self, fleet: str, offer: Offer, count: int, subnet: str | None, zone: str | None
    ) -> list[Instance]:
        import botocore.exceptions as bx

        region = offer.region
        ec2 = self.client(region)
        start = await self._existing_count(region, fleet)
        kw: dict[str, Any] = {
            "ImageId": await self._image(region),
            "InstanceType": offer.instance_type,
            "MinCount": count,
            "MaxCount": count,
            "SecurityGroupIds": [await self._security_group(region, subnet)],
            "UserData": STARTUP_SCRIPT,
            "TagSpecifications": [
                {"ResourceType": rt, "Tags": self._tags(fleet, start)}
                for rt in ("instance", "volume")
            ],
        }
        key = await self._key_name(region)
        if key:
            kw["KeyName"] = key
        if subnet:
            kw["SubnetId"] = subnet
        if zone:
            kw["Placement"] = {"AvailabilityZone": zone}
        if offer.spot:
            kw["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        try:
            resp = await self._call(lambda: ec2.run_instances(**kw))
        except bx.ClientError as e:
            code = _code(e)
            if code in CAPACITY_CODES:
                raise CapacityError(NAME, code, offer) from None
            raise ProviderError(
                NAME, f"{code} creating {offer.instance_type} in {region}"
            ) from None
        out = []
        for n, inst in enumerate(resp["Instances"]):
            iid = str(inst["InstanceId"])
            # Name tags all carry the first index (one call); rename each to its own.
            name_tag = [{"Key": "Name", "Value": f"{fleet}-{start + n}"}]
            await self._api(functools.partial(ec2.create_tags, Resources=[iid], Tags=name_tag))
            out.append(
                Instance(
                    provider=NAME,
                    id=iid,
                    name=f"{fleet}-{start + n}",
                    fleet=fleet,
                    hostname=self._hostname(inst),
                    region=region,
                    zone=_zone(inst),
                    price_per_hour=offer.price_per_hour,
                    status="provisioning",
                )
            )
        return out

    # -- prices

    async def current_prices(
        self, types: Sequence[str], regions: Sequence[str]
    ) -> dict[tuple[str, str], RegionPrice]:
        """Today's on-demand (Price List API) and spot (spot price history) prices of
        `types` in `regions`, for `dstack catalog refresh`."""
        from dstack_plan.providers.aws.pricing import PRICING_REGION, fetch_prices

        if self._session is None:
            self.client(PRICING_REGION)  # makes the session
        pricing = self._session.client("pricing", region_name=PRICING_REGION)
        return await fetch_prices(self._api, pricing, self.client, types, regions)

    # -- read / terminate

    def _instance(self, inst: dict[str, Any], region: str) -> Instance | None:
        state = inst["State"]["Name"]
        if state not in _STATUS:
            return None
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        item = self.catalog().item(inst["InstanceType"])
        price = 0.0
        if item and region in item.regions:
            p = item.regions[region]
            spot = inst.get("InstanceLifecycle") == "spot"
            price = (p.spot or p.on_demand) if spot else p.on_demand
        return Instance(
            provider=NAME,
            id=inst["InstanceId"],
            name=tags.get("Name", inst["InstanceId"]),
            fleet=tags.get("dstack-plan:fleet", ""),
            hostname=self._hostname(inst),
            region=region,
            zone=_zone(inst),
            resources=item.resources() if item else None,
            price_per_hour=price,
            status=_STATUS[state],  # type: ignore[arg-type]
        )

    async def _describe(self, region: str, **kw: Any) -> list[dict[str, Any]]:
        ec2 = self.client(region)

        def fetch() -> list[dict[str, Any]]:
            pages = ec2.get_paginator("describe_instances").paginate(**kw)
            return [i for p in pages for r in p["Reservations"] for i in r["Instances"]]

        return await self._api(fetch)

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        """The instances as EC2 sees them now; terminated or unknown ones left out."""
        by_region: dict[str, list[str]] = {}
        for i in instances:
            by_region.setdefault(i.region, []).append(i.id)
        out: list[Instance] = []
        for region, ids in by_region.items():
            # By filter rather than InstanceIds: an unknown id must not fail the batch.
            raw = await self._describe(region, Filters=[{"Name": "instance-id", "Values": ids}])
            out += [x for x in (self._instance(r, region) for r in raw) if x is not None]
        return out

    async def terminate(self, instances: Sequence[Instance]) -> None:
        """`terminate_instances` per region; already gone is silent."""
        import botocore.exceptions as bx

        by_region: dict[str, list[str]] = {}
        for i in instances:
            by_region.setdefault(i.region, []).append(i.id)
        for region in by_region:
            live = [i.id for i in await self.refresh([i for i in instances if i.region == region])]
            if not live:
                continue
            ec2 = self.client(region)
            try:
                await self._call(functools.partial(ec2.terminate_instances, InstanceIds=live))
            except bx.ClientError as e:
                if _code(e) != "InvalidInstanceID.NotFound":
                    raise ProviderError(NAME, f"EC2 error {_code(e)} terminating") from None

    async def _tagged(self, region: str, fleet: str | None) -> list[Instance]:
        filters = [{"Name": "tag:dstack-plan:project", "Values": [self.project]}]
        if self.lineage:
            filters.append({"Name": "tag:dstack-plan:lineage", "Values": [self.lineage]})
        if fleet is not None:
            filters.append({"Name": "tag:dstack-plan:fleet", "Values": [fleet]})
        raw = await self._describe(region, Filters=filters)
        return [x for x in (self._instance(r, region) for r in raw) if x is not None]

    async def tagged_instances(self, fleet: str | None = None) -> list[Instance]:
        """Every non-terminated instance of this project (and lineage) in the configured
        regions, for destroy and drift checks."""
        out: list[Instance] = []
        for region in self.regions():
            out += await self._tagged(region, fleet)
        return out

    async def agent(self, instance: Instance) -> AgentClient:
        """Not here: a booted instance is a host of its fleet, reached over SSH like an SSH
        fleet's (`fleets/cloud.py`)."""
        raise ProviderError(NAME, "aws instances are reached through their fleet's SSH hosts")

    async def close(self) -> None:
        """Drop the clients (boto3 holds no connection worth closing explicitly)."""
        self._clients.clear()
        self._session = None


def _zone(inst: dict[str, Any]) -> str | None:
    zone = inst.get("Placement", {}).get("AvailabilityZone")
    return str(zone) if zone else None
