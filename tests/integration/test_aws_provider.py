"""The `aws` provider against moto's EC2 (a real boto3 client on a loopback server)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from dstack_plan.config.backends import AWSBackend
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.errors import ProviderError
from dstack_plan.providers.aws.provider import AWSProvider
from dstack_plan.providers.base import Offer
from dstack_plan.providers.capacity import CapacityError, create_first

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG0ZBCf1w4R2Jv0V7l6C0y8Gf3yHkq3fGz1mX1uX0h4Z t@x"
REGION = "us-east-1"


def _provider(moto_server: Any, project: str) -> AWSProvider:
    cfg = AWSBackend.model_validate({"type": "aws", "regions": [REGION]})
    return AWSProvider(
        cfg,
        project=project,
        lineage="l1",
        ssh_public_key=KEY,
        endpoint_url=moto_server.endpoint_url,
    )


def _fail_types(provider: AWSProvider, types: set[str]) -> None:
    """Make RunInstances answer InsufficientInstanceCapacity for `types`."""
    from botocore.awsrequest import AWSResponse

    body = (
        b'<?xml version="1.0"?><Response><Errors><Error><Code>InsufficientInstanceCapacity'
        b"</Code><Message>none</Message></Error></Errors><RequestID>x</RequestID></Response>"
    )

    def hook(request: Any, **_: Any) -> AWSResponse | None:
        data = request.body.decode() if isinstance(request.body, bytes) else str(request.body)
        if any(f"InstanceType={t}" in data for t in types):
            return AWSResponse(request.url, 400, {}, _Raw(body))
        return None

    provider.client(REGION).meta.events.register("before-send.ec2.RunInstances", hook)


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body

    def read(self, *_: Any) -> bytes:
        return self.body


async def test_lifecycle(moto_server: Any) -> None:
    p = _provider(moto_server, "life")
    offers = await p.offers(ResourcesSpec.model_validate({"gpu": "A100"}))
    assert offers and {o.instance_type for o in offers} <= {"p4d.24xlarge", "p4de.24xlarge"}
    assert [o.price_per_hour for o in offers] == sorted(o.price_per_hour for o in offers)
    offer = next(o for o in offers if o.spot)

    created = await p.create_instances("f", offer, 2)
    assert len(created) == 2 and all(i.status == "provisioning" for i in created)
    raw = p.client(REGION).describe_instances(InstanceIds=[i.id for i in created])
    insts = [i for r in raw["Reservations"] for i in r["Instances"]]
    assert len(insts) == 2
    for inst in insts:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["dstack-plan:project"] == "life" and tags["dstack-plan:fleet"] == "f"
        assert tags["dstack-plan:lineage"] == "l1"
        assert inst["InstanceLifecycle"] == "spot"
        assert inst["KeyName"].startswith("dstack-plan-life-")
        assert inst["SecurityGroups"][0]["GroupName"] == "dstack-plan-life"

    refreshed = await p.refresh(created)
    assert {i.status for i in refreshed} == {"idle"} and all(i.hostname for i in refreshed)
    assert {i.id for i in await p.tagged_instances()} == {i.id for i in created}

    more = await p.create_instances("f", offer, 1)
    everything = created + more
    assert len(await p.tagged_instances("f")) == 3

    await p.terminate(everything)
    assert await p.refresh(everything) == []
    assert await p.tagged_instances() == []
    await p.terminate(everything)
    await p.close()


async def test_create_first_falls_through(moto_server: Any) -> None:
    p = _provider(moto_server, "fall")
    offers = [o for o in await p.offers() if not o.spot][:2]
    _fail_types(p, {offers[0].instance_type})
    result = await create_first(lambda _: p, "g", offers, 1)
    created = result.instances
    assert created[0].price_per_hour == offers[1].price_per_hour and result.offer == offers[1]
    assert result.refused == [
        f"{offers[0].instance_type} {REGION} on-demand: InsufficientInstanceCapacity"
    ]
    await p.terminate(created)


async def test_create_first_all_fail(moto_server: Any) -> None:
    p = _provider(moto_server, "allfail")
    offers: list[Offer] = [o for o in await p.offers() if not o.spot][:2]
    _fail_types(p, {o.instance_type for o in offers})
    with pytest.raises(ProviderError) as e:
        await create_first(lambda _: p, "g", offers, 1)
    for o in offers:
        assert o.instance_type in str(e.value)


def test_no_credentials_is_a_provider_error(tmp_path: Any) -> None:
    code = (
        "import asyncio\n"
        "from dstack_plan.errors import ProviderError\n"
        "from dstack_plan.providers.aws.provider import AWSProvider\n"
        "try:\n"
        "    asyncio.run(AWSProvider(endpoint_url='http://127.0.0.1:9').offers())\n"
        "except ProviderError as e:\n"
        "    print('OK', e)\n"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_CONFIG_FILE": "/nonexistent",
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.startswith("OK aws:"), out.stderr
    assert "Traceback" not in out.stderr


def test_import_does_not_import_boto3() -> None:
    code = "import dstack_plan.providers.aws.provider, sys; assert 'boto3' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_machines_go_to_the_first_availability_zone_with_capacity(moto_server: Any) -> None:
    p = _provider(moto_server, "zones")
    offer = next(o for o in await p.offers() if not o.spot)
    wanted = offer.model_copy(update={"zones": ("us-east-1c", "us-east-1d")})
    (first,) = await p.create_instances("z", wanted, 1)
    assert first.zone == "us-east-1c"
    # us-east-1c has no room now: the next zone of the list takes the machine
    from botocore.awsrequest import AWSResponse

    refusal = (
        b'<?xml version="1.0"?><Response><Errors><Error><Code>InsufficientInstanceCapacity'
        b"</Code><Message>none</Message></Error></Errors><RequestID>x</RequestID></Response>"
    )

    def full_zone(request: Any, **_: Any) -> AWSResponse | None:
        data = request.body.decode() if isinstance(request.body, bytes) else str(request.body)
        if "Placement.AvailabilityZone=us-east-1c" in data:
            return AWSResponse(request.url, 400, {}, _Raw(refusal))
        return None

    p.client(REGION).meta.events.register("before-send.ec2.RunInstances", full_zone)
    (second,) = await p.create_instances("z", wanted, 1)
    assert second.zone == "us-east-1d"
    only_c = offer.model_copy(update={"zones": ("us-east-1c",)})
    with pytest.raises(CapacityError):  # every zone it may use is full: the next offer's turn
        await p.create_instances("z", only_c, 1)
    await p.terminate([first, second])
    await p.close()


async def test_a_configured_subnet_outside_the_zones_is_named(moto_server: Any) -> None:
    ec2 = _provider(moto_server, "subnets").client(REGION)
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    subnet_a = ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.1.0/24", AvailabilityZone="us-east-1a")
    subnet_b = ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.2.0/24", AvailabilityZone="us-east-1b")
    ids = [subnet_a["Subnet"]["SubnetId"], subnet_b["Subnet"]["SubnetId"]]
    cfg = AWSBackend.model_validate({"type": "aws", "regions": [REGION], "subnet_ids": ids})
    p = AWSProvider(cfg, project="subnets", lineage="l1", ssh_public_key=KEY,
                    endpoint_url=moto_server.endpoint_url)  # fmt: skip
    offer = next(o for o in await p.offers() if not o.spot)
    (made,) = await p.create_instances("s", offer.model_copy(update={"zones": ("us-east-1b",)}), 1)
    assert made.zone == "us-east-1b"  # the configured subnet in that zone
    with pytest.raises(ProviderError, match=r"none of the configured subnets .* \(us-east-1e\)"):
        await p.create_instances("s", offer.model_copy(update={"zones": ("us-east-1e",)}), 1)
    await p.terminate([made])
    await p.close()
