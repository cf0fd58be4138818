"""Fresh prices for the `aws` catalogue: on-demand from the AWS Price List API, spot from
EC2's spot price history (the lowest current price over the region's zones).

Only the catalogue's instance types are priced (their shapes do not change); a type the
Price List does not know in a region keeps its shipped price there, and is reported.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from dstack_plan.errors import ProviderError
from dstack_plan.providers.catalog import RegionPrice

T = TypeVar("T")
Call = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a blocking boto3 call off the loop, its errors ProviderErrors (`AWSProvider._api`)."""

PRICING_REGION = "us-east-1"
"""Where the Price List API answers for every region."""
_LINUX_SHARED = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}


def _on_demand_usd(price_list: Sequence[str]) -> float | None:
    """The hourly USD price in the first Price List entry that has one."""
    for raw in price_list:
        terms = json.loads(raw).get("terms", {}).get("OnDemand", {})
        for term in terms.values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if usd is not None and float(usd) > 0:
                    return float(usd)
    return None


async def fetch_prices(
    call: Call,
    pricing: Any,
    ec2_of: Callable[[str], Any],
    types: Sequence[str],
    regions: Sequence[str],
) -> dict[tuple[str, str], RegionPrice]:
    """(instance type, region) → its current on-demand and spot price, for the pairs the
    APIs price, through the Price List client `pricing` and each region's EC2 client
    (`ec2_of(region)`); ProviderError when the Price List cannot be reached or refuses."""
    out: dict[tuple[str, str], RegionPrice] = {}
    for region in regions:
        spot = await _spot(call, ec2_of(region), types)
        for instance_type in types:
            filters = [
                {"Type": "TERM_MATCH", "Field": k, "Value": v}
                for k, v in {
                    **_LINUX_SHARED,
                    "regionCode": region,
                    "instanceType": instance_type,
                }.items()
            ]
            ask = functools.partial(
                pricing.get_products, ServiceCode="AmazonEC2", Filters=filters, MaxResults=10
            )
            resp = await call(ask)
            usd = _on_demand_usd(resp.get("PriceList", []))
            if usd is not None:
                out[(instance_type, region)] = RegionPrice(
                    on_demand=usd, spot=spot.get(instance_type)
                )
    return out


async def _spot(call: Call, ec2: Any, types: Sequence[str]) -> dict[str, float]:
    def fetch() -> dict[str, float]:
        lowest: dict[str, float] = {}
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=list(types),
            ProductDescriptions=["Linux/UNIX"],
            StartTime=datetime.datetime.now(datetime.timezone.utc),
        )
        for page in pages:
            for entry in page["SpotPriceHistory"]:
                price = float(entry["SpotPrice"])
                name = entry["InstanceType"]
                lowest[name] = min(price, lowest.get(name, price))
        return lowest

    try:
        return dict(await call(fetch))
    except ProviderError:
        return {}  # spot prices are a bonus: on-demand ones still refresh
