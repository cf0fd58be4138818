"""Which cloud offers a fleet's machines may come from, best first. Pure: no I/O.

A fleet's `resources` must hold the whole machine (`offer_mismatch`: every range, both
bounds), and its placement fields narrow the rest: `regions`, `instance_types`, `max_price`
and `spot_policy` (`spot`: spot only; `on-demand`: on-demand only; `auto`: spot first, cheapest
first, then on-demand, as dstack falls back). What is left is tried in that order, at most
`MAX_TRIES` of them (`apply/cloud_create.py`). When nothing is left, `why_none` says how
many offers each rule turned away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from dstack_plan.config.profile import SpotPolicy
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import Offer
from dstack_plan.providers.matching import offer_mismatch

MAX_TRIES = 25
"""Offers tried before a create gives up (dstack tries as many)."""


@dataclass(frozen=True, slots=True)
class OfferPolicy:
    """What a fleet's placement fields allow."""

    resources: ResourcesSpec | None = None
    spot_policy: SpotPolicy = "on-demand"
    max_price: float | None = None
    """$ per hour for one machine."""
    regions: tuple[str, ...] | None = None
    instance_types: tuple[str, ...] | None = None
    run: ResourcesSpec | None = None
    """A run's `resources`, when the machines are added for it: they must hold it too."""
    zones: tuple[str, ...] | None = None
    """`availability_zones`: an offer is allowed only in a region that has one of them, and
    then carries those (`Offer.zones`)."""


@dataclass(frozen=True, slots=True)
class OfferRanking:
    ranked: tuple[Offer, ...]
    """The offers allowed, in the order to try them."""
    turned_away: tuple[tuple[str, int], ...] = ()
    """(rule, how many offers it turned away), most first."""

    def why_none(self) -> str:
        """`no offer matches: 40 lack the resources, 3 are above max_price`."""
        if not self.turned_away:
            return "no offers at all"
        parts = [f"{count} {rule}" for rule, count in self.turned_away]
        return "no offer matches: " + ", ".join(parts)


def rank_offers(offers: Sequence[Offer], policy: OfferPolicy) -> OfferRanking:
    """The offers `policy` allows, best first; see the module doc."""
    rejected: Counter[str] = Counter()
    allowed: list[Offer] = []
    regions = {r.lower() for r in policy.regions} if policy.regions else None
    types = {t.lower() for t in policy.instance_types} if policy.instance_types else None
    for offer in offers:
        rule = _rejected_by(offer, policy, regions, types)
        zones = None if policy.zones is None else zones_in(offer.region, policy.zones)
        if rule is None and zones == ():
            rule = "are in regions without the availability_zones"
        if rule is None:
            allowed.append(offer if zones is None else offer.model_copy(update={"zones": zones}))
        else:
            rejected[rule] += 1
    if policy.spot_policy == "auto":
        allowed.sort(key=lambda o: (not o.spot, o.price_per_hour))
    else:
        allowed.sort(key=lambda o: o.price_per_hour)
    return OfferRanking(tuple(allowed), tuple(rejected.most_common()))


def zones_in(region: str, zones: Sequence[str]) -> tuple[str, ...]:
    """The zones of `zones` that are in `region`: AWS and GCP name a zone by its region and
    a suffix (`us-east-1b`, `us-central1-a`). Azure's zones (`1`, `2`) name no region, and
    its machines here are created without one, so none is in any region."""
    return tuple(z for z in zones if z.startswith(region) and len(z) > len(region))


def _rejected_by(
    offer: Offer, policy: OfferPolicy, regions: set[str] | None, types: set[str] | None
) -> str | None:
    if regions is not None and offer.region.lower() not in regions:
        return "are in other regions"
    if types is not None and offer.instance_type.lower() not in types:
        return "are other instance types"
    if policy.spot_policy == "spot" and not offer.spot:
        return "are on-demand (spot_policy: spot)"
    if policy.spot_policy == "on-demand" and offer.spot:
        return "are spot (spot_policy: on-demand)"
    if policy.resources is not None and offer_mismatch(policy.resources, offer.resources):
        return "lack the resources"
    if policy.run is not None and offer_mismatch(policy.run, offer.resources):
        return "cannot hold the run"
    if policy.max_price is not None and offer.price_per_hour > policy.max_price:
        return f"are above max_price ${policy.max_price:g}/h"
    return None
