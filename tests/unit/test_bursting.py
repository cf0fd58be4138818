"""Where a run goes when its first fleet cannot take it: new machines of a cloud fleet, within
`nodes.max` (counting what other runs of the same plan burst there)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dstack_plan.config.fleet import FleetSpec
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.runs import TaskSpec
from dstack_plan.fleets.cloud_records import CloudFleetRecord
from dstack_plan.plan.model import Placement
from dstack_plan.providers.base import Instance, Offer, Provider
from dstack_plan.providers.catalog import catalog_offers
from dstack_plan.runs.bursting import burst_offer


class Catalogue(Provider):
    """The shipped AWS catalogue in us-east-1, as offers (nothing else is asked of it)."""

    name = "aws"

    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        return catalog_offers("aws", ["us-east-1"])

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        raise AssertionError("planning creates nothing")

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        raise AssertionError("not asked")

    async def terminate(self, instances: Sequence[Instance]) -> None:
        raise AssertionError("not asked")

    async def agent(self, instance: Instance):  # type: ignore[no-untyped-def]
        raise AssertionError("not asked")


FLEET = FleetSpec.model_validate(
    {"type": "fleet", "name": "burst", "nodes": "0..2", "spot_policy": "auto"}
)
LEFT = Placement(fleet="onprem", provider="ssh", placed=False, pending=True,
                 note="pending: onprem (gpu): needs 1 free GPU, 0 free")  # fmt: skip


def task(nodes: int = 1, gpu: str = "A10G:1") -> TaskSpec:
    spec = {"type": "task", "name": "train", "commands": ["true"], "nodes": nodes,
            "resources": {"gpu": gpu}}  # fmt: skip
    return TaskSpec.model_validate(spec)


def offer(run: TaskSpec, claimed: int = 0) -> Placement | str:
    return asyncio.run(
        burst_offer(run, "burst", FLEET, CloudFleetRecord(), [Catalogue()], LEFT, claimed)
    )


def test_new_machines_come_from_the_cheapest_offer_that_holds_the_run() -> None:
    placed = offer(task())
    assert placed is not None and placed.offer is not None
    assert (placed.offer.instance_type, placed.offer.spot, placed.offer.count) == (
        "g5.xlarge",
        True,
        1,
    )
    assert placed.note is not None
    assert placed.note.startswith("burst: onprem cannot take it now (onprem (gpu): needs 1")


def test_no_room_under_nodes_max_no_burst_and_says_why() -> None:
    # 3 machines, the fleet may have 2
    assert offer(task(nodes=3)) == "fleet burst: nodes.max 2 reached (0 up; needs 3 more)"
    assert isinstance(offer(task(nodes=2)), Placement)
    assert offer(task(nodes=2), claimed=1) == (  # another run of the plan took one
        "fleet burst: nodes.max 2 reached (0 up, 1 more for other runs of this plan; needs 2 more)"
    )
    no_offer = offer(task(gpu="H200:1"))  # no offer holds it
    assert isinstance(no_offer, str)
    assert no_offer.startswith("fleet burst: no offer matches: ")
    assert "cannot hold the run" in no_offer


def test_an_unconfigured_backend_is_named() -> None:
    run = task()
    why = asyncio.run(burst_offer(run, "burst", FLEET, CloudFleetRecord(), [], LEFT))
    assert why == "fleet burst: its backend is not configured"


def test_a_run_with_zoned_volumes_bursts_to_machines_in_their_zone() -> None:
    run = task()
    placed = asyncio.run(
        burst_offer(run, "burst", FLEET, CloudFleetRecord(), [Catalogue()], LEFT, 0, "us-east-1c")
    )
    assert isinstance(placed, Placement) and placed.offer is not None
    assert placed.offer.zones == ("us-east-1c",)  # apply creates them there
    assert placed.note is not None and "in aws us-east-1 (us-east-1c) (spot)" in placed.note
    zoned = FLEET.model_copy(update={"availability_zones": ("us-east-1a", "us-east-1b")})
    why = asyncio.run(
        burst_offer(run, "burst", zoned, CloudFleetRecord(), [Catalogue()], LEFT, 0, "us-east-1c")
    )
    assert why == (
        "fleet burst: its volumes are in us-east-1c, which is not one of the fleet's "
        "availability_zones (us-east-1a, us-east-1b)"
    )
    anywhere = asyncio.run(
        burst_offer(run, "burst", zoned, CloudFleetRecord(), [Catalogue()], LEFT)
    )
    assert isinstance(anywhere, Placement) and anywhere.offer is not None
    assert anywhere.offer.zones == ("us-east-1a", "us-east-1b")  # the fleet's own
