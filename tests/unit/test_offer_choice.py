"""Which offers a cloud fleet's fields allow, and in which order apply tries them."""

from __future__ import annotations

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import GPU, MachineResources, Offer
from dstack_plan.scheduler.offer_choice import OfferPolicy, rank_offers


def offer(kind: str, price: float, *, spot: bool = False, region: str = "us-east-1",
          gpus: int = 0) -> Offer:  # fmt: skip
    return Offer(
        provider="aws",
        instance_type=kind,
        region=region,
        resources=MachineResources(
            cpus=8,
            memory_gb=32,
            disk_gb=100,
            gpus=tuple(GPU(vendor="nvidia", name="A10G", memory_mib=24576) for _ in range(gpus)),
        ),
        price_per_hour=price,
        spot=spot,
    )


OFFERS = [
    offer("g5.xlarge", 1.0, gpus=1),
    offer("g5.xlarge", 0.4, gpus=1, spot=True),
    offer("m5.2xlarge", 0.38),
    offer("m5.2xlarge", 0.1, spot=True),
    offer("g5.xlarge", 0.9, gpus=1, region="eu-west-1"),
]


def names(policy: OfferPolicy) -> list[tuple[str, str, bool]]:
    return [(o.instance_type, o.region, o.spot) for o in rank_offers(OFFERS, policy).ranked]


def test_on_demand_is_the_default_and_cheapest_comes_first() -> None:
    assert names(OfferPolicy()) == [
        ("m5.2xlarge", "us-east-1", False),
        ("g5.xlarge", "eu-west-1", False),
        ("g5.xlarge", "us-east-1", False),
    ]


def test_auto_tries_every_spot_offer_before_falling_back_to_on_demand() -> None:
    gpu = ResourcesSpec.model_validate({"gpu": "A10G:1"})
    assert names(OfferPolicy(resources=gpu, spot_policy="auto")) == [
        ("g5.xlarge", "us-east-1", True),
        ("g5.xlarge", "eu-west-1", False),
        ("g5.xlarge", "us-east-1", False),
    ]


def test_regions_types_and_max_price_narrow_the_offers() -> None:
    policy = OfferPolicy(spot_policy="spot", regions=("US-EAST-1",), max_price=0.2)
    assert names(policy) == [("m5.2xlarge", "us-east-1", True)]
    assert names(OfferPolicy(instance_types=("g5.xlarge",), regions=("eu-west-1",))) == [
        ("g5.xlarge", "eu-west-1", False)
    ]


def test_when_nothing_is_left_each_rule_says_how_many_it_turned_away() -> None:
    gpu = ResourcesSpec.model_validate({"gpu": "A10G:1"})
    ranking = rank_offers(OFFERS, OfferPolicy(resources=gpu, max_price=0.5))
    assert ranking.ranked == ()
    assert ranking.why_none() == (
        "no offer matches: 2 are above max_price $0.5/h, 2 are spot (spot_policy: on-demand), "
        "1 lack the resources"
    )
    assert rank_offers([], OfferPolicy()).why_none() == "no offers at all"


def test_availability_zones_keep_offers_in_their_regions_and_travel_with_them() -> None:
    zones = ("eu-west-1b", "us-east-1d", "us-east-1a")
    ranking = rank_offers(OFFERS, OfferPolicy(zones=zones))
    assert {(o.region, o.zones) for o in ranking.ranked} == {
        ("us-east-1", ("us-east-1d", "us-east-1a")),  # the fleet's order, this region's zones
        ("eu-west-1", ("eu-west-1b",)),
    }
    only_eu = rank_offers(OFFERS, OfferPolicy(zones=("eu-west-1c",)))
    assert [o.region for o in only_eu.ranked] == ["eu-west-1"]
    elsewhere = rank_offers(OFFERS, OfferPolicy(zones=("ap-south-1a",), spot_policy="auto"))
    assert elsewhere.ranked == ()
    assert (
        elsewhere.why_none() == "no offer matches: 5 are in regions without the availability_zones"
    )  # noqa: E501
    # Azure's zones name no region: no offer is in them
    assert rank_offers(OFFERS, OfferPolicy(zones=("1", "2"))).ranked == ()
    assert rank_offers(OFFERS, OfferPolicy()).ranked[0].zones is None  # any zone


def test_a_fleets_availability_zones_reach_the_offers_apply_creates_from() -> None:
    import asyncio

    from dstack_plan.config.fleet import FleetSpec
    from dstack_plan.fleets.offers import ranked_offers

    class Listed:
        name = "aws"

        async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
            return OFFERS

    spec = FleetSpec.model_validate(
        {"type": "fleet", "name": "zoned", "nodes": 1, "availability_zones": ["us-east-1f"]}
    )
    ranking = asyncio.run(ranked_offers(spec, [Listed()]))  # type: ignore[list-item]
    assert [(o.instance_type, o.zones) for o in ranking.ranked] == [
        ("m5.2xlarge", ("us-east-1f",)),
        ("g5.xlarge", ("us-east-1f",)),
    ]
