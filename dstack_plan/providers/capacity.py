"""Creating machines from the first offer that has capacity, in the order given.

Clouds refuse an offer for reasons that pass (no capacity in the zone, a spot price above the
bid, a quota reached): the next offer may do. `create_first` tries offers in order, at most
`limit`, and records each refusal; when none succeeds, the error lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dstack_plan.errors import ProviderError
from dstack_plan.providers.base import Instance, Offer, Provider


class CapacityError(ProviderError):
    """The provider cannot give `offer` now (no capacity or quota): try the next one."""

    def __init__(self, provider: str, code: str, offer: Offer):
        self.code = code
        self.offer = offer
        super().__init__(provider, f"{code} for {offer.instance_type} in {offer.region}")


@dataclass(frozen=True, slots=True)
class Created:
    instances: list[Instance]
    offer: Offer
    """The offer they came from."""
    refused: list[str]
    """`p4d.24xlarge us-east-1 spot: InsufficientInstanceCapacity`, one per offer tried before."""


async def create_first(
    provider_of: Callable[[str], Provider],
    fleet: str,
    offers: Sequence[Offer],
    count: int,
    *,
    limit: int = 25,
) -> Created:
    """`count` machines for `fleet` from the first of `offers` (at most `limit`) whose provider
    (`provider_of(offer.provider)`) has capacity. ProviderError listing every refusal when none
    has; other errors pass at once (they would repeat for every offer)."""
    refused: list[str] = []
    for offer in list(offers)[:limit]:
        try:
            instances = await provider_of(offer.provider).create_instances(fleet, offer, count)
        except CapacityError as e:
            kind = "spot" if offer.spot else "on-demand"
            refused.append(f"{offer.instance_type} {offer.region} {kind}: {e.code}")
            continue
        return Created(instances, offer, refused)
    providers = sorted({o.provider for o in offers}) or ["cloud"]
    raise ProviderError(
        ", ".join(providers), "no offer could be had: " + "; ".join(refused or ["no offers"])
    )
