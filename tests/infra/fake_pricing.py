"""A fake AWS Price List API (`pricing.get_products`, JSON 1.1 over HTTP) for boto3.

boto3 reaches it through `AWS_ENDPOINT_URL_PRICING`. It answers the on-demand price the test
set for an (instance type, region), in the Price List's own shape: each entry a JSON string
with `product.attributes` and `terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tests.infra.rest_server import Reply, Request, RestApp


@dataclass
class FakePricing(RestApp):
    prices: dict[tuple[str, str], float] = field(default_factory=dict)
    """(instance type, region code) → hourly USD on-demand price."""

    def __post_init__(self) -> None:
        RestApp.__init__(self)

    def handle(self, request: Request) -> Reply:
        target = request.headers.get("X-Amz-Target", "")
        if target != "AWSPriceListService.GetProducts":
            return Reply(400, {"__type": "UnknownOperationException", "message": target})
        wanted = {f["Field"]: f["Value"] for f in request.body.get("Filters", [])}
        if wanted.get("operatingSystem") != "Linux" or wanted.get("tenancy") != "Shared":
            return Reply(200, {"PriceList": [], "FormatVersion": "aws_v1"})
        key = (wanted.get("instanceType", ""), wanted.get("regionCode", ""))
        price = self.prices.get(key)
        entries = [] if price is None else [_entry(*key, price)]
        return Reply(200, {"PriceList": entries, "FormatVersion": "aws_v1"})


def _entry(instance_type: str, region: str, usd: float) -> str:
    return json.dumps(
        {
            "product": {"attributes": {"instanceType": instance_type, "regionCode": region}},
            "terms": {
                "OnDemand": {
                    "SKU.JRTCKXETXF": {
                        "priceDimensions": {
                            "SKU.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": f"{usd:.10f}"},
                            }
                        }
                    }
                }
            },
        }
    )
