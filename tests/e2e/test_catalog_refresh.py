"""`dstack catalog refresh`: today's AWS prices (a fake Price List API for on-demand, moto's
spot price history for spot) written to the project, and read by `dstack offer` after."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack
from tests.infra.fake_azure_prices import FakeAzurePrices
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
