"""Fresh prices for the `azure` catalogue, from the Azure Retail Prices API.

The API is public (no credentials): one query per region for the catalogue's VM sizes,
pay-as-you-go (`Consumption`) Linux prices, the spot price from the entry whose SKU name
ends in ` Spot`. Windows and Low Priority entries are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dstack_plan.errors import ProviderError
from dstack_plan.providers.catalog import RegionPrice

NAME = "azure"
PRICES_URL = "https://prices.azure.com"
MAX_PAGES = 50
"""A runaway `NextPageLink` chain stops here."""


def price_filter(sizes: Sequence[str], region: str) -> str:
    """The OData filter for the Linux pay-as-you-go prices of `sizes` in `region`."""
    wanted = " or ".join(f"armSkuName eq '{s}'" for s in sorted(sizes))
    return (
        f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
        f"armRegionName eq '{region}' and ({wanted})"
    )


def region_prices(items: Sequence[dict[str, Any]]) -> dict[str, RegionPrice]:
    """VM size → its on-demand and spot price, from one region's Retail Prices items."""
    on_demand: dict[str, float] = {}
    spot: dict[str, float] = {}
    for item in items:
        if "Windows" in str(item.get("productName", "")):
            continue
        sku_name = str(item.get("skuName", ""))
        if sku_name.endswith(" Low Priority") or item.get("unitOfMeasure") != "1 Hour":
            continue
        size, price = str(item.get("armSkuName", "")), float(item.get("retailPrice", 0))
        if price <= 0:
            continue
        into = spot if sku_name.endswith(" Spot") else on_demand
        into[size] = min(price, into.get(size, price))
    return {s: RegionPrice(on_demand=p, spot=spot.get(s)) for s, p in on_demand.items()}


def fetch_region(base_url: str, sizes: Sequence[str], region: str) -> dict[str, RegionPrice]:
    """One region's prices (blocking: run it off the loop); ProviderError when the API
    cannot be reached or answers with an error."""
    import requests

    url: str | None = f"{base_url.rstrip('/')}/api/retail/prices"
    params: dict[str, str] | None = {
        "api-version": "2023-01-01-preview",
        "$filter": price_filter(sizes, region),
    }
    items: list[dict[str, Any]] = []
    for _ in range(MAX_PAGES):
        if url is None:
            break
        try:
            resp = requests.get(url, params=params, timeout=30)
            resp.raise_for_status()
            page = resp.json()
        except requests.RequestException as e:
            raise ProviderError(
                NAME, f"cannot read the Retail Prices API: {type(e).__name__}"
            ) from None
        except ValueError:
            raise ProviderError(
                NAME, "the Retail Prices API answered something not JSON"
            ) from None
        items += page.get("Items", [])
        url, params = page.get("NextPageLink"), None  # the link carries the query
    return region_prices(items)
