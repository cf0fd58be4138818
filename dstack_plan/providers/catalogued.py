"""What the cloud providers share: offers priced from a catalogue, in configured regions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dstack_plan.providers.base import Provider
from dstack_plan.providers.catalog import Catalog, load_catalog
from dstack_plan.providers.offer_cache import OfferCache

if TYPE_CHECKING:
    from dstack_plan.config.backends import CloudBackend


class CataloguedProvider(Provider):
    """A cloud provider whose machine types and prices come from its catalogue
    (`providers/catalog/`), the project's refreshed one when `catalog_file` exists."""

    config: CloudBackend | None

    def __init__(
        self,
        config: CloudBackend | None,
        *,
        project: str,
        lineage: str,
        ssh_public_key: str | None,
        cache: OfferCache | None,
        catalog_file: Path | None,
    ):
        self.config = config
        self.project = project
        """The project's name in tags (`providers/configured.project_name`)."""
        self.lineage = lineage
        """The state's lineage, in tags: two states of one project never share machines."""
        self.ssh_public_key = ssh_public_key
        """The project key's public half, given to created machines (None: planning only)."""
        self.cache = cache or OfferCache(None)
        """What the cloud offers where, kept across commands (`providers/offer_cache.py`)."""
        self.catalog_file = catalog_file
        """The project's refreshed catalogue, read instead of the shipped one if it exists."""

    def catalog(self) -> Catalog:
        """The project's refreshed catalogue if it has one, else the shipped one."""
        return load_catalog(self.name, self.catalog_file)

    def regions(self) -> list[str]:
        """The configured regions, else every region of the catalogue."""
        if self.config is not None and self.config.regions:
            return list(self.config.regions)
        return sorted({r for i in self.catalog().items for r in i.regions})
