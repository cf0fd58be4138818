"""`dstack catalog refresh`: today's prices of a catalogue, from the provider's pricing APIs.

The catalogue's machine types and regions stay as they are (their shapes do not change);
each (type, region) the APIs price gets today's on-demand and spot price, the others keep the
price they had, and the result is written to the project (`.dstack/catalog/PROVIDER.json`),
where the provider reads it instead of the shipped one. Writing it is atomic: a refresh cut
short leaves the previous catalogue.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dstack_plan.config.atomic import write_private_atomic
from dstack_plan.providers.capabilities import ProviderWithPrices
from dstack_plan.providers.catalog import Catalog, CatalogItem, load_catalog, project_catalog_file


@dataclass(frozen=True, slots=True)
class CatalogRefresh:
    provider: str
    path: Path
    """Where the refreshed catalogue was written."""
    priced: int
    """(type, region) pairs given today's price."""
    kept: list[str]
    """`TYPE REGION` pairs the APIs did not price: their previous price stays."""


async def refresh_catalog(
    name: str,
    provider: ProviderWithPrices,
    project_dir: str | Path,
    *,
    regions: Sequence[str] | None = None,
    today: datetime.date | None = None,
) -> CatalogRefresh:
    """Price the catalogue of provider `name` (the project's if it has one, else the shipped
    one) in `regions` (None: all of the catalogue's) and write it to the project."""
    path = project_catalog_file(project_dir, name)
    base = load_catalog(name, path)
    wanted = sorted({r for i in base.items for r in i.regions if regions is None or r in regions})
    prices = await provider.current_prices([i.instance_type for i in base.items], wanted)
    kept: list[str] = []
    items: list[CatalogItem] = []
    for item in base.items:
        updated = dict(item.regions)
        for region in item.regions:
            if region not in wanted:
                continue
            fresh = prices.get((item.instance_type, region))
            if fresh is None:
                kept.append(f"{item.instance_type} {region}")
            else:
                updated[region] = fresh
        items.append(item.model_copy(update={"regions": updated}))
    day = (today or datetime.date.today()).isoformat()
    priced = sum(1 for i in base.items for r in i.regions if r in wanted) - len(kept)
    catalog = Catalog(
        format=1,
        provider=name,
        version=day,
        source=f"refreshed on {day} from {name}'s pricing APIs ({priced} prices; "
        f"{len(kept)} kept from version {base.version})",
        items=items,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, (catalog.model_dump_json(indent=1) + "\n").encode())
    load_catalog.cache_clear()  # this process reads the new one from now on
    return CatalogRefresh(name, path, priced, kept)


async def refresh_project(
    project_dir: str | Path, *, backend: str | None = None, regions: Sequence[str] | None = None
) -> tuple[list[CatalogRefresh], list[str]]:
    """Refresh the catalogue of every backend `.dstack/backends.yml` configures (`backend`
    only, when given) whose provider can price it: (refreshes, notes on those that could
    not be). A provider's ProviderError is a note; the others still refresh."""
    from dstack_plan.errors import ProviderError
    from dstack_plan.providers.configured import cloud_providers

    found = cloud_providers(project_dir, only=backend)
    done: list[CatalogRefresh] = []
    notes = list(found.notes)
    for provider in found.providers:
        try:
            if not isinstance(provider, ProviderWithPrices):
                notes.append(f"{provider.name}: no pricing API in this version")
                continue
            done.append(
                await refresh_catalog(provider.name, provider, project_dir, regions=regions)
            )
        except ProviderError as e:
            notes.append(f"{provider.name}: {e.detail}")
        finally:
            await provider.close()
    return done, notes
