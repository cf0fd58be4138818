"""A fake Azure Retail Prices API (`GET /api/retail/prices`), which needs no credentials.

It answers the items the test set for a region, two per page (so `NextPageLink` is followed),
in the API's shape: `armSkuName`, `armRegionName`, `skuName` (`D4s v5`, `D4s v5 Spot`,
`D4s v5 Low Priority`), `productName` (`... Windows` for Windows prices), `retailPrice`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tests.infra.rest_server import Reply, Request, RestApp

_REGION = re.compile(r"armRegionName eq '([^']+)'")
PAGE = 2


@dataclass
class FakeAzurePrices(RestApp):
    items: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        RestApp.__init__(self)

    def add(self, size: str, region: str, price: float, kind: str = "") -> None:
        """A price of `size` in `region`; `kind`: "" (Linux), "Spot", "Low Priority" or
        "Windows"."""
        short = size.removeprefix("Standard_").replace("_", " ")
        sku = f"{short} {kind}".strip() if kind in ("Spot", "Low Priority") else short
        product = f"Virtual Machines {short} Series" + (" Windows" if kind == "Windows" else "")
        self.items.append(
            {
                "armSkuName": size,
                "armRegionName": region,
                "skuName": sku,
                "productName": product,
                "serviceName": "Virtual Machines",
                "type": "Consumption",
                "unitOfMeasure": "1 Hour",
                "retailPrice": price,
            }
        )

    def handle(self, request: Request) -> Reply:
        if request.path != "/api/retail/prices":
            return Reply(404, {"Error": "no route"})
        query = request.query.get("$filter", [""])[0]
        region = _REGION.search(query)
        wanted = [
            i for i in self.items if region and i["armRegionName"] == region.group(1)
            and f"armSkuName eq '{i['armSkuName']}'" in query
        ]  # fmt: skip
        skip = int(request.query.get("$skip", ["0"])[0])
        page = wanted[skip : skip + PAGE]
        more = skip + PAGE < len(wanted)
        link = None
        if more:
            link = f"{self.base_url}/api/retail/prices?$filter={query}&$skip={skip + PAGE}"
        return Reply(200, {"Items": page, "NextPageLink": link, "Count": len(page)})
