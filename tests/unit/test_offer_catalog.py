"""The shipped offer catalogue: valid, sorted, deterministic, filterable."""

from __future__ import annotations

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.catalog import catalog_offers, load_catalog
from dstack_plan.providers.matching import offer_mismatch


def test_catalog_loads_and_covers_the_types() -> None:
    cat = load_catalog("aws")
    types = {i.instance_type for i in cat.items}
    assert {"t3.medium", "g5.xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"} <= types
    for item in cat.items:
        assert item.regions and item.cpus > 0
        for p in item.regions.values():
            assert p.spot is None or 0 < p.spot < p.on_demand


def test_offers_sorted_and_deterministic() -> None:
    offers = catalog_offers("aws", None)
    keys = [(o.price_per_hour, o.instance_type, o.region) for o in offers]
    assert keys == sorted(keys)
    assert offers == catalog_offers("aws", None)
    g5 = next(o for o in offers if o.instance_type == "g5.12xlarge")
    assert len(g5.resources.gpus) == 4 and g5.resources.gpus[0].vendor == "nvidia"
    assert g5.resources.disk_gb == 100


def test_a100_filter_keeps_only_p4() -> None:
    req = ResourcesSpec.model_validate({"gpu": "A100"})
    kept = {
        o.instance_type
        for o in catalog_offers("aws", None)
        if offer_mismatch(req, o.resources) is None
    }
    assert kept == {"p4d.24xlarge", "p4de.24xlarge"}


def test_spot_only_and_cheaper() -> None:
    spot = catalog_offers("aws", ["us-east-1"], spot=True)
    assert spot and all(o.spot for o in spot)
    od = {
        (o.instance_type, o.region): o.price_per_hour
        for o in catalog_offers("aws", ["us-east-1"], spot=False)
    }
    assert all(o.price_per_hour < od[(o.instance_type, o.region)] for o in spot)
