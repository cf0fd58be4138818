"""Composing GCP machine-type prices from per-resource Cloud Billing SKUs
(`providers/gcp/pricing.py`), on SKUs parsed by the real google-cloud-billing types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.cloud import billing_v1

from dstack_plan.providers.catalog import CatalogItem, load_catalog
from dstack_plan.providers.gcp.pricing import Rate, compose_prices, sku_rate
from tests.infra.fake_gcp_billing import core, gpu, ram, sku

US, EU = "us-central1", "europe-west4"


def _rates(*skus: dict[str, Any]) -> list[Rate]:
    parsed = [sku_rate(billing_v1.Sku.from_json(json.dumps(s))) for s in skus]
    return [r for r in parsed if r is not None]


def _item(instance_type: str) -> CatalogItem:
    item = load_catalog("gcp").item(instance_type)
    assert item is not None
    return item


A2 = [
    core("A2", [US], 0.031611),
    ram("A2", [US], 0.004237),
    gpu("Tesla A100", [US], 2.933908),
    core("A2", [US], 0.012644, spot=True),
    ram("A2", [US], 0.001695, spot=True),
    gpu("Tesla A100", [US], 1.17357, spot=True),
]


def test_a2_highgpu_1g_is_12_vcpus_85_gib_and_one_a100_on_demand_and_spot() -> None:
    prices = compose_prices([_item("a2-highgpu-1g")], _rates(*A2), [US])
    price = prices[("a2-highgpu-1g", US)]
    assert price.on_demand == pytest.approx(12 * 0.031611 + 85 * 0.004237 + 2.933908)
    assert price.spot == pytest.approx(12 * 0.012644 + 85 * 0.001695 + 1.17357)


def test_eight_gpus_count_eight_times_and_the_80gb_a100_has_its_own_sku() -> None:
    skus = [*A2, gpu("Tesla A100 80GB", [US], 3.93)]
    items = [_item("a2-highgpu-8g"), _item("a2-ultragpu-1g")]
    prices = compose_prices(items, _rates(*skus), [US])
    eight = prices[("a2-highgpu-8g", US)]
    assert eight.on_demand == pytest.approx(96 * 0.031611 + 680 * 0.004237 + 8 * 2.933908)
    ultra = prices[("a2-ultragpu-1g", US)]
    assert ultra.on_demand == pytest.approx(12 * 0.031611 + 170 * 0.004237 + 3.93)
    assert ultra.spot is None  # no spot price for the 80GB A100: no spot price for the type


def test_n1_with_an_attached_t4_adds_the_gpu_to_the_predefined_core_and_ram() -> None:
    # the catalogue has no N1 type: one as the catalogue would carry it
    n1 = CatalogItem.model_validate(
        {
            "instance_type": "n1-standard-4",
            "cpus": 4,
            "memory_gb": 15,
            "gpus": {"name": "T4", "memory_mib": 16384, "count": 1},
            "regions": {US: {"on_demand": 1.0}},
        }
    )
    skus = [core("N1", [US], 0.031611), ram("N1", [US], 0.004237), gpu("Tesla T4", [US], 0.35)]
    rates = _rates(*skus)
    assert {(r.kind, r.name) for r in rates} == {("core", "n1"), ("ram", "n1"), ("gpu", "T4")}
    price = compose_prices([n1], rates, [US])[("n1-standard-4", US)]
    assert price.on_demand == pytest.approx(4 * 0.031611 + 15 * 0.004237 + 0.35)
    assert price.spot is None


def test_a_region_or_part_without_a_sku_leaves_the_type_unpriced_there() -> None:
    skus = [
        *A2,
        core("E2", [US, EU], 0.021811),
        ram("E2", [US], 0.002923),  # none in europe-west4
        core("G2", [US], 0.024988),
        ram("G2", [US], 0.002927),  # and no L4 anywhere
    ]
    items = [_item("a2-highgpu-1g"), _item("e2-standard-4"), _item("g2-standard-4")]
    prices = compose_prices(items, _rates(*skus), [US, EU])
    assert set(prices) == {("a2-highgpu-1g", US), ("e2-standard-4", US)}
    assert prices[("e2-standard-4", US)].on_demand == pytest.approx(4 * 0.021811 + 16 * 0.002923)


def test_spot_wordings_units_and_what_no_predefined_type_pays() -> None:
    rates = _rates(
        gpu("H100 80GB", [US], 3.5, spot=True),  # "... attached to Spot Preemptible VMs ..."
        sku("N2 Custom Instance Core running in Americas", "CPU", [US], 0.033),
        sku("N2D AMD Instance Core running in Americas", "CPU", [US], 0.029),
        sku("Commitment v1: A2 Cpu in Americas for 1 Year", "CPU", [US], 0.02, usage="Commit1Yr"),
        sku("Storage PD Capacity", "PDStandard", [US], 0.04, unit="GiBy.mo", family="Storage"),
        sku("A2 Instance Ram running in Americas", "RAM", [US], 0.004, unit="GBy.h"),
    )
    assert rates == [Rate("gpu", "H100 80GB", True, (US,), 3.5)]
