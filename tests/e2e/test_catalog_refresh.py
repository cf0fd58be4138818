"""`dstack catalog refresh`: today's AWS prices (a fake Price List API for on-demand, moto's
spot price history for spot) written to the project, and read by `dstack offer` after; Azure's
from a fake Retail Prices API, GCP's composed from a fake Cloud Billing catalogue's SKUs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack
from tests.infra.fake_azure_prices import FakeAzurePrices
from tests.infra.fake_gcp import service_account_file
from tests.infra.fake_gcp_billing import FakeGCPBilling, core, gpu, ram, sku
from tests.infra.fake_pricing import FakePricing
from tests.infra.moto_server import CREDENTIALS, REGION
from tests.infra.rest_server import RestServer

pytestmark = pytest.mark.aws


@pytest.fixture
def pricing() -> Iterator[FakePricing]:
    app = FakePricing()
    server = RestServer(app)
    yield app
    server.stop()


def test_refresh_prices_the_catalogue_and_offers_use_it(
    dstack: Dstack,
    tmp_path: Path,
    cli_env: dict[str, str],
    moto_server: Any,
    pricing: FakePricing,
) -> None:
    project = tmp_path / "project"
    (project / ".dstack").mkdir()
    (project / ".dstack" / "backends.yml").write_text(
        f"backends:\n  - type: aws\n    regions: [{REGION}]\n"
    )
    cli_env.update(CREDENTIALS)
    cli_env["AWS_ENDPOINT_URL"] = moto_server.endpoint_url
    cli_env["AWS_ENDPOINT_URL_PRICING"] = pricing.base_url
    pricing.prices[("p4d.24xlarge", REGION)] = 21.9576
    pricing.prices[("t3.medium", REGION)] = 0.0416

    done = dstack("catalog", "refresh", "--region", REGION, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    view = json.loads(done.stdout)
    (refreshed,) = view["refreshed"]
    assert refreshed["provider"] == "aws" and refreshed["priced"] == 2
    assert "p5.48xlarge us-east-1" in refreshed["kept"]  # unpriced: keeps its price
    catalogue = json.loads((project / ".dstack" / "catalog" / "aws.json").read_text())
    p4d = next(i for i in catalogue["items"] if i["instance_type"] == "p4d.24xlarge")
    assert p4d["regions"][REGION]["on_demand"] == 21.9576
    assert p4d["regions"][REGION]["spot"] == pytest.approx(0.00001)  # what moto's history says
    assert p4d["regions"]["eu-west-1"]["on_demand"] > 0  # a region not asked for: as it was
    # each Price List query asked for one type in one region, Linux, shared tenancy
    asked = pricing.sent("POST")
    assert asked and all(r.body["ServiceCode"] == "AmazonEC2" for r in asked)

    offers = dstack("offer", "--backend", "aws", "--gpu", "A100", "--json")
    assert offers.returncode == 0, offers.stderr
    rows = json.loads(offers.stdout)["offers"]
    on_demand = [r for r in rows if r["host"] == "p4d.24xlarge" and r["region"] == REGION]
    assert [r["price_per_hour"] for r in on_demand] == [21.9576]

    text = dstack("catalog", "refresh", "--backend", "gcp")
    assert text.returncode == 1
    assert "gcp: not configured in .dstack/backends.yml" in text.stdout + text.stderr


def test_refresh_prices_the_azure_catalogue_from_the_retail_prices_api(
    dstack: Dstack, tmp_path: Path
) -> None:
    prices = FakeAzurePrices()
    server = RestServer(prices)
    prices.add("Standard_NC24ads_A100_v4", "eastus", 3.5)
    prices.add("Standard_NC24ads_A100_v4", "eastus", 0.7, "Spot")
    prices.add("Standard_NC24ads_A100_v4", "eastus", 0.5, "Low Priority")
    prices.add("Standard_NC24ads_A100_v4", "eastus", 9.9, "Windows")
    prices.add("Standard_D4s_v5", "eastus", 0.2)
    project = tmp_path / "project"
    (project / ".dstack").mkdir()
    (project / ".dstack" / "backends.yml").write_text(
        "backends:\n  - type: azure\n    subscription_id: s1\n    regions: [eastus]\n"
        f"    prices_endpoint: {prices.base_url}\n"
    )
    try:
        done = dstack("catalog", "refresh", "--backend", "azure", "--region", "eastus")
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        "azure: 2 prices refreshed, 6 kept -> .dstack/catalog/azure.json"
    )
    catalogue = json.loads((project / ".dstack" / "catalog" / "azure.json").read_text())
    a100 = next(i for i in catalogue["items"] if i["instance_type"] == "Standard_NC24ads_A100_v4")
    assert a100["regions"]["eastus"] == {"on_demand": 3.5, "spot": 0.7}
    d4 = next(i for i in catalogue["items"] if i["instance_type"] == "Standard_D4s_v5")
    assert d4["regions"]["eastus"] == {"on_demand": 0.2, "spot": None}
    assert len(prices.sent("GET")) == 3  # five items, two a page: the next links followed


@pytest.mark.gcp
def test_refresh_composes_the_gcp_catalogue_from_cloud_billing_skus(
    dstack: Dstack, tmp_path: Path
) -> None:
    us = "us-central1"
    billing = FakeGCPBilling()
    billing.skus += [
        core("A2", [us], 0.031611),
        ram("A2", [us], 0.004237),
        gpu("Tesla A100", [us], 2.933908),
        gpu("Tesla A100 80GB", [us], 3.93),
        core("A2", [us], 0.012644, spot=True),
        ram("A2", [us], 0.001695, spot=True),
        gpu("Tesla A100", [us], 1.17357, spot=True),
        core("E2", [us, "europe-west4"], 0.021811),
        ram("E2", [us, "europe-west4"], 0.002923),
        core("G2", [us], 0.024988),  # no L4 SKU: the g2 types keep their price
        ram("G2", [us], 0.002927),
        sku("Commitment v1: A2 Cpu in Americas for 1 Year", "CPU", [us], 0.02, usage="Commit1Yr"),
    ]
    server = RestServer(billing)
    sa = service_account_file(tmp_path)
    project = tmp_path / "project"
    (project / ".dstack").mkdir(parents=True)
    (project / ".dstack" / "backends.yml").write_text(
        "backends:\n  - type: gcp\n    project_id: proj-1\n"
        f"    credentials_file: {sa}\n    billing_endpoint: {billing.base_url}\n"
    )
    try:
        done = dstack("catalog", "refresh", "--backend", "gcp", "--region", us)
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    # a2-highgpu-1g, -8g, a2-ultragpu-1g, -8g, e2-standard-4; n2, both g2 and a3 kept
    assert done.stdout.startswith("gcp: 5 prices refreshed, 4 kept -> .dstack/catalog/gcp.json")
    catalogue = json.loads((project / ".dstack" / "catalog" / "gcp.json").read_text())
    items = {i["instance_type"]: i["regions"] for i in catalogue["items"]}
    a2 = items["a2-highgpu-1g"][us]
    assert a2["on_demand"] == pytest.approx(12 * 0.031611 + 85 * 0.004237 + 2.933908)
    assert a2["spot"] == pytest.approx(12 * 0.012644 + 85 * 0.001695 + 1.17357)
    ultra = items["a2-ultragpu-8g"][us]
    assert ultra == {
        "on_demand": pytest.approx(96 * 0.031611 + 1360 * 0.004237 + 8 * 3.93),
        "spot": None,
    }
    assert items["e2-standard-4"][us]["on_demand"] == pytest.approx(4 * 0.021811 + 16 * 0.002923)
    assert items["g2-standard-4"][us] == {"on_demand": 0.7068, "spot": 0.2827}  # as shipped
    assert items["e2-standard-4"]["europe-west4"]["on_demand"] == 0.1474  # not asked for
    pages = billing.sent("GET")
    assert len(pages) == 3  # twelve SKUs, four a page: the page tokens followed
    assert pages[0].query["currencyCode"] == ["USD"]
    assert pages[0].headers["authorization"].startswith("Bearer ")  # the service account's
