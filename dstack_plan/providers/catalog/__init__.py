"""The offer catalogue: versioned per-provider JSON price lists shipped with the package.

Cloud providers answer "what could I have, at what price" from this snapshot rather than from
pricing APIs, so a plan is fast, offline and deterministic; the provider then narrows it to
what the cloud says is offered in each region.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.errors import ProviderError
from dstack_plan.providers.base import GPU, MachineResources, Offer

ROOT_DISK_GB = 100.0
"""The root volume a created instance gets by default."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CatalogGPU(_Model):
    name: str
    memory_mib: int
    count: int


class RegionPrice(_Model):
    on_demand: float
    spot: float | None = None
    """None: no spot market for this type in this region."""


class CatalogItem(_Model):
    instance_type: str
    cpus: int
    memory_gb: float
    cpu_arch: Literal["x86", "arm"] = "x86"
    gpus: CatalogGPU | None = None
    disk_gb: float = 0
    """Instance-store disk (0: EBS only)."""
    regions: dict[str, RegionPrice]

    def resources(self) -> MachineResources:
        """The machine this type is, with the default root volume."""
        gpus: tuple[GPU, ...] = ()
        if self.gpus is not None:
            g = GPU(vendor="nvidia", name=self.gpus.name, memory_mib=self.gpus.memory_mib)
            gpus = (g,) * self.gpus.count
        return MachineResources(
            cpus=self.cpus,
            cpu_arch=self.cpu_arch,
            memory_gb=self.memory_gb,
            disk_gb=ROOT_DISK_GB,
            gpus=gpus,
        )


class Catalog(_Model):
    format: Literal[1]
    provider: str
    version: str
    source: str
    items: list[CatalogItem]

    def item(self, instance_type: str) -> CatalogItem | None:
        """The entry for `instance_type` (None: not in the catalogue)."""
        return next((i for i in self.items if i.instance_type == instance_type), None)


PROJECT_CATALOG_DIR = ".dstack/catalog"
"""Where `dstack catalog refresh` writes a project's own price lists (committed, so a team
plans with the same prices); a provider's file there replaces the shipped one."""


def project_catalog_file(project_dir: str | Path, provider: str) -> Path:
    return Path(project_dir) / PROJECT_CATALOG_DIR / f"{provider}.json"


@functools.cache
def load_catalog(provider: str, override: Path | None = None) -> Catalog:
    """The catalogue of `provider`: the file `override` names when it exists (a project's
    refreshed one), else the shipped one (each read once per process); ProviderError when
    the one read is corrupt or none ships."""
    if override is not None and override.is_file():
        return _parse(provider, override.read_text("utf-8"), str(override))
    try:
        text = resources.files(__name__).joinpath(f"{provider}.json").read_text("utf-8")
    except (FileNotFoundError, OSError):
        raise ProviderError(provider, "no offer catalogue ships for this provider") from None
    return _parse(provider, text, "the offer catalogue")


def _parse(provider: str, text: str, what: str) -> Catalog:
    try:
        return Catalog.model_validate(json.loads(text))
    except (ValueError, ValidationError) as e:
        raise ProviderError(provider, f"{what} is corrupt: {e}") from None


def catalog_offers(
    provider: str,
    regions: Sequence[str] | None,
    *,
    spot: bool | None = None,
    override: Path | None = None,
) -> list[Offer]:
    """Every (type, region, spot) of the catalogue (`load_catalog(provider, override)`) as an
    Offer, cheapest first (ties by type, then region). `regions` None: all; `spot` None:
    both on-demand and spot."""
    cat = load_catalog(provider, override)
    out: list[Offer] = []
    for item in cat.items:
        res = item.resources()
        for region, price in item.regions.items():
            if regions is not None and region not in regions:
                continue
            kinds: list[tuple[bool, float]] = []
            if spot is not True:
                kinds.append((False, price.on_demand))
            if spot is not False and price.spot is not None:
                kinds.append((True, price.spot))
            for is_spot, p in kinds:
                out.append(
                    Offer(
                        provider=provider,
                        instance_type=item.instance_type,
                        region=region,
                        resources=res,
                        price_per_hour=p,
                        spot=is_spot,
                    )
                )
    out.sort(key=lambda o: (o.price_per_hour, o.instance_type, o.region, o.spot))
    return out
