"""A fake Cloud Billing Catalog API for the real google-cloud-billing client: `GET
/v1/services/6F81-5844-456A/skus`, the Compute Engine SKUs a test added, a few a page (so
`nextPageToken` is followed), in the API's JSON shape. `core`, `ram` and `gpu` build SKUs
worded as Google words them; unit tests use them without a server.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from tests.infra.rest_server import Reply, Request, RestApp

SERVICE = "services/6F81-5844-456A"
PAGE = 4
_IDS = itertools.count(1)
_GEO = {"us": "Americas", "europe": "EMEA", "asia": "APAC"}


def sku(
    description: str,
    group: str,
    regions: list[str],
    usd: float,
    *,
    usage: str = "OnDemand",
    unit: str = "h",
    family: str = "Compute",
) -> dict[str, Any]:
    """One SKU as the API sends it (int64 `units` as a JSON string)."""
    sku_id = f"{next(_IDS):04X}-0000-0000"
    units = int(usd)
    return {
        "name": f"{SERVICE}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": family,
            "resourceGroup": group,
            "usageType": usage,
        },
        "serviceRegions": regions,
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "displayQuantity": 1,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {
                                "currencyCode": "USD",
                                "units": str(units),
                                "nanos": round((usd - units) * 1e9),
                            },
                        }
                    ],
                },
                "currencyConversionRate": 1,
                "effectiveTime": "2026-11-01T00:00:00Z",
            }
        ],
        "serviceProviderName": "Google",
    }


def _where(regions: list[str]) -> str:
    return _GEO.get(regions[0].split("-")[0], "Americas")


def _vm(family: str, what: str, regions: list[str], usd: float, spot: bool) -> dict[str, Any]:
    n1 = family == "N1"
    text = f"{family} {'Predefined ' if n1 else ''}Instance {what} running in {_where(regions)}"
    group = "N1Standard" if n1 else ("CPU" if what == "Core" else "RAM")
    return sku(
        f"Spot Preemptible {text}" if spot else text,
        group,
        regions,
        usd,
        usage="Preemptible" if spot else "OnDemand",
        unit="h" if what == "Core" else "GiBy.h",
    )


def core(family: str, regions: list[str], usd: float, *, spot: bool = False) -> dict[str, Any]:
    """The vCPU-hour price of machine family `family` (`A2`, `N1`...)."""
    return _vm(family, "Core", regions, usd, spot)


def ram(family: str, regions: list[str], usd: float, *, spot: bool = False) -> dict[str, Any]:
    """The GiB-hour price of the memory of `family`."""
    return _vm(family, "Ram", regions, usd, spot)


def gpu(name: str, regions: list[str], usd: float, *, spot: bool = False) -> dict[str, Any]:
    """The hourly price of one GPU (`Tesla A100`, `Tesla A100 80GB`, `L4`, `H100 80GB`)."""
    text = f"Nvidia {name} GPU running in {_where(regions)}"
    if spot:  # Google words it both ways
        text = (
            f"Nvidia {name} GPU attached to Spot Preemptible VMs running in {_where(regions)}"
            if name.startswith("H100")
            else f"Spot Preemptible {text}"
        )
    return sku(text, "GPU", regions, usd, usage="Preemptible" if spot else "OnDemand")


@dataclass
class FakeGCPBilling(RestApp):
    skus: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        RestApp.__init__(self)

    def handle(self, request: Request) -> Reply:
        if request.method != "GET" or request.path != f"/v1/{SERVICE}/skus":
            return Reply(
                404, {"error": {"code": 404, "message": "no route", "status": "NOT_FOUND"}}
            )
        start = int(request.query.get("pageToken", ["0"])[0] or 0)
        end = start + PAGE  # fewer than the client asks for: paging is exercised
        body: dict[str, Any] = {"skus": self.skus[start:end]}
        body["nextPageToken"] = str(end) if end < len(self.skus) else ""
        return Reply(200, body)
