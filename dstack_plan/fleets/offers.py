"""Where a cloud fleet's new machines come from: the offers its fields allow, best first.

The plan shows the first (`fleet_placement`: type, region, spot or not, price, and the fleet's
hourly cost after the change); apply tries them in order (`fleets/cloud.py`), so a type without
capacity falls through to the next. How many machines: `target_nodes`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dstack_plan.apply.events import plural
from dstack_plan.errors import PlanError, ProviderError
from dstack_plan.fleets.cloud_records import CloudFleetRecord
from dstack_plan.plan.model import MachineOffer, Placement
from dstack_plan.providers.base import Offer, Provider
from dstack_plan.scheduler.offer_choice import OfferPolicy, OfferRanking, rank_offers

if TYPE_CHECKING:
    from dstack_plan.config.fleet import FleetSpec
    from dstack_plan.config.resources import ResourcesSpec


def target_nodes(spec: FleetSpec, have: int = 0) -> int:
    """The machines apply makes the fleet have, when it has `have` now: at least
    `nodes.target` (else `nodes.min`), at most `nodes.max`. Machines above the target that a
    run added stay: watch releases them when idle."""
    nodes = spec.nodes
    if nodes is None:
        return 0
    wanted = max(have, nodes.min if nodes.target is None else nodes.target)
    return wanted if nodes.max is None else min(wanted, nodes.max)


def offer_policy(spec: FleetSpec) -> OfferPolicy:
    return OfferPolicy(
        resources=spec.resources,
        spot_policy=spec.spot_policy,
        max_price=spec.max_price,
        regions=spec.regions,
        instance_types=spec.instance_types,
        zones=spec.availability_zones,
    )


async def ranked_offers(
    spec: FleetSpec,
    providers: Sequence[Provider],
    run: ResourcesSpec | None = None,
    zones: Sequence[str] | None = None,
) -> OfferRanking:
    """Every offer of `providers` that `spec` allows (and that holds `run`'s resources, for
    machines added for a run; in `zones` when given, instead of the fleet's own), in the
    order to try them."""
    listed = await asyncio.gather(*(p.offers(spec.resources) for p in providers))
    offers: list[Offer] = [o for found in listed for o in found]
    policy = replace(offer_policy(spec), run=run)
    if zones is not None:
        policy = replace(policy, zones=tuple(zones))
    return rank_offers(offers, policy)


def run_zones(spec: FleetSpec, volume_zone: str | None) -> tuple[str, ...] | str | None:
    """Where machines of fleet `spec` for a run whose volumes are in `volume_zone` may be
    created: that zone, if the fleet's `availability_zones` allow it (else why not, as a
    string); the fleet's own zones (None: any) for a run without zoned volumes."""
    if volume_zone is None:
        return spec.availability_zones
    allowed = spec.availability_zones
    if allowed is not None and volume_zone not in allowed:
        return (
            f"its volumes are in {volume_zone}, which is not one of the fleet's "
            f"availability_zones ({', '.join(allowed)})"
        )
    return (volume_zone,)


async def fleet_placement(
    address: str,
    spec: FleetSpec,
    provider: str,
    current: CloudFleetRecord,
    providers: Sequence[Provider],
) -> Placement:
    """What the plan says of a cloud fleet it creates or changes; PlanError when no offer
    allows the machines it must create."""
    name = address.split(".", 1)[1]
    target = target_nodes(spec, len(current.instances))
    kept = current.instances[:target]
    kept_price = sum(i.price_per_hour for i in kept)
    new = target - len(kept)
    if new <= 0:
        leaving = len(current.instances) - target
        if not kept:
            note = "no machines (nodes: 0)" if not leaving else f"all {leaving} terminated"
        elif leaving:
            note = f"{plural(target, 'machine')} kept, {leaving} terminated"
        else:
            note = f"{plural(target, 'machine')} kept"
        return Placement(
            fleet=name, provider=provider, price_per_hour=round(kept_price, 4), note=note
        )
    if not providers:
        raise PlanError(f"{address}: no usable cloud backend to create its machines")
    try:
        ranking = await ranked_offers(spec, providers)
    except ProviderError as e:
        raise PlanError(f"{address}: cannot list offers: {e}") from None
    if not ranking.ranked:
        names = ", ".join(p.name for p in providers)
        raise PlanError(
            f"{address}: cannot create {plural(new, 'machine')} on {names}: {ranking.why_none()}"
        )
    best = ranking.ranked[0]
    note = f"{new} × {offer_text(best)}"
    if kept:
        note += f", {len(kept)} kept"
    return Placement(
        fleet=name,
        provider=provider,
        price_per_hour=round(kept_price + new * best.price_per_hour, 4),
        note=note,
        offer=machine_offer(best, new),
    )


def offer_text(offer: Offer) -> str:
    """`g5.xlarge in aws us-east-1 (spot) at $0.405/h each`; with zones, `in aws us-east-1
    (us-east-1b, us-east-1c)`."""
    spot = " (spot)" if offer.spot else ""
    zones = f" ({', '.join(offer.zones)})" if offer.zones else ""
    return (
        f"{offer.instance_type} in {offer.provider} {offer.region}{zones}{spot} at "
        f"${offer.price_per_hour:.3f}/h each"
    )


def machine_offer(offer: Offer, count: int) -> MachineOffer:
    """What the plan records of `count` machines from `offer`."""
    return MachineOffer(
        provider=offer.provider,
        instance_type=offer.instance_type,
        region=offer.region,
        spot=offer.spot,
        price_per_hour=offer.price_per_hour,
        count=count,
        zones=offer.zones,
    )
