"""Fresh prices for the `gcp` catalogue, from the Cloud Billing Catalog API.

Compute Engine has no price per machine type: its SKUs price a family's vCPU hour
(`A2 Instance Core running in Americas`, N1's `N1 Predefined Instance Core ...`), its RAM
GiB-hour (`... Instance Ram ...`) and each accelerator's hour (`Nvidia Tesla A100 GPU running
in ...`), on-demand (`usageType` OnDemand) and spot (Preemptible: `Spot Preemptible ...`).
A type's price is composed from its catalogue shape: vCPUs × core + memory × RAM + GPUs ×
GPU. A type some part of which has no SKU in a region is not priced there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dstack_plan.providers.catalog import CatalogGPU, CatalogItem, RegionPrice

COMPUTE_SERVICE = "services/6F81-5844-456A"
"""The Compute Engine service of the Cloud Billing catalogue."""
BILLING_ENDPOINT = "cloudbilling.googleapis.com"
PAGE_SIZE = 5000

Kind = Literal["core", "ram", "gpu"]
_UNIT: dict[Kind, str] = {"core": "h", "ram": "GiBy.h", "gpu": "h"}
_USAGE = {"OnDemand": False, "Preemptible": True}
# `Custom`, `Sole Tenancy`, `N2D AMD`... do not match: no type of the catalogue pays them
_VM = re.compile(
    r"^(?P<family>[A-Z][A-Z0-9]*) (?:Predefined )?Instance (?P<kind>Core|Ram) running"
)
_GPU = re.compile(r"^Nvidia (?:Tesla )?(?P<gpu>.+?) GPU (?:attached to .*? VMs )?running in ")


@dataclass(frozen=True, slots=True)
class Rate:
    """One SKU: the hourly USD price of one unit of one resource, in some regions."""

    kind: Kind
    name: str
    """The machine family for cores and RAM (`a2`), the GPU for GPUs (`A100 80GB`)."""
    spot: bool
    regions: tuple[str, ...]
    usd: float


def sku_rate(sku: Any) -> Rate | None:
    """The rate a `billing_v1.Sku` sets, None for SKUs no catalogue type is priced by
    (commitments, custom shapes, disks, licences...)."""
    category = sku.category
    spot = _USAGE.get(category.usage_type)
    if category.resource_family != "Compute" or spot is None or not sku.pricing_info:
        return None
    # the spot wording varies (`Spot Preemptible X`, `X attached to Spot Preemptible VMs`);
    # usageType already says which it is
    text = re.sub(r"^(?:Spot )?Preemptible ", "", sku.description)
    kind: Kind
    if m := _VM.match(text):
        kind, name = ("core" if m["kind"] == "Core" else "ram"), m["family"].lower()
    elif m := _GPU.match(text):
        kind, name = "gpu", m["gpu"]
    else:
        return None
    expression = sku.pricing_info[-1].pricing_expression
    if expression.usage_unit != _UNIT[kind] or not expression.tiered_rates:
        return None
    # a free tier, where one exists, comes first: the last tier is what usage costs
    price = expression.tiered_rates[-1].unit_price
    usd = int(price.units) + price.nanos / 1e9
    return Rate(kind, name, spot, tuple(sku.service_regions), usd)


def list_rates(client: Any, regions: Sequence[str]) -> list[Rate]:
    """Every rate of the Compute Engine SKUs in `regions`, through a `CloudCatalogClient`
    (blocking, all pages: run it off the loop)."""
    wanted = set(regions)
    pages = client.list_skus(
        request={"parent": COMPUTE_SERVICE, "currency_code": "USD", "page_size": PAGE_SIZE}
    )
    rates = (sku_rate(sku) for sku in pages)
    return [r for r in rates if r is not None and wanted.intersection(r.regions)]


def _gpu_name(gpu: CatalogGPU, named: set[str]) -> str:
    """The SKU name of a catalogue GPU: memory-qualified (`A100 80GB`) when such a SKU
    exists, else the bare name, which Google keeps for the variant it launched first."""
    sized = f"{gpu.name} {gpu.memory_mib // 1024}GB"
    return sized if sized in named else gpu.name


def compose_prices(
    items: Iterable[CatalogItem], rates: Iterable[Rate], regions: Sequence[str]
) -> dict[tuple[str, str], RegionPrice]:
    """(type, region) → its composed on-demand and spot price, for the pairs whose every
    part has an on-demand rate there (spot None unless every part has a spot one too)."""
    table: dict[tuple[Kind, str, bool, str], float] = {}
    for r in rates:
        for region in r.regions:
            key = (r.kind, r.name, r.spot, region)
            table[key] = min(r.usd, table.get(key, r.usd))
    gpus_named = {name for kind, name, _, _ in table if kind == "gpu"}
    out: dict[tuple[str, str], RegionPrice] = {}
    for item in items:
        family = item.instance_type.split("-")[0]  # `a2-highgpu-1g` → `a2`
        # Compute Engine's "GB" of memory are GiB, which the RAM SKUs price
        parts: list[tuple[Kind, str, float]] = [
            ("core", family, item.cpus),
            ("ram", family, item.memory_gb),
        ]
        if item.gpus is not None:
            parts.append(("gpu", _gpu_name(item.gpus, gpus_named), item.gpus.count))
        for region in regions:
            on_demand = _total(table, parts, False, region)
            if on_demand is not None:
                spot = _total(table, parts, True, region)
                out[(item.instance_type, region)] = RegionPrice(on_demand=on_demand, spot=spot)
    return out


def _total(
    table: dict[tuple[Kind, str, bool, str], float],
    parts: Sequence[tuple[Kind, str, float]],
    spot: bool,
    region: str,
) -> float | None:
    total = 0.0
    for kind, name, amount in parts:
        usd = table.get((kind, name, spot, region))
        if usd is None:
            return None
        total += amount * usd
    return round(total, 6)  # a sum of per-unit rates: drop the float noise from the JSON
