"""The cloud providers a project configures in `.dstack/backends.yml`, built without I/O.

Every configured backend whose provider ships is built with its configuration and what its
tags name (the project and the state's lineage); a backend this version cannot use (no
provider yet, or its SDK extra not installed) is a note for the user, never an error: the
rest still answer.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dstack_plan.errors import ProviderError
from dstack_plan.providers.base import Provider
from dstack_plan.providers.catalog import project_catalog_file
from dstack_plan.providers.names import ANY_CLOUD, CLOUDS
from dstack_plan.providers.offer_cache import OfferCache
from dstack_plan.providers.project_key import project_key
from dstack_plan.providers.registry import provider_class

if TYPE_CHECKING:
    from dstack_plan.config.backends import BackendsFile

SDK_MODULE = {"aws": "boto3", "gcp": "google.cloud.compute", "azure": "azure.mgmt.compute"}
"""The module each provider's SDK extra installs (`pip install 'dstack-plan[aws]'`)."""
SHIPPED = frozenset({"aws", "gcp", "azure"})
"""Cloud providers this version has; the other backend types are configured ahead of them."""


class CloudProviders(NamedTuple):
    providers: list[Provider]
    notes: list[str]
    """A line per configured backend that cannot be used, saying why."""


def load_backends(project_dir: str | Path) -> BackendsFile:
    """`config.backends.load_backends`, imported only by projects that ask."""
    from dstack_plan.config.backends import load_backends as load

    return load(project_dir)


def cloud_providers(
    project_dir: str | Path, *, lineage: str = "", only: str | None = None
) -> CloudProviders:
    """The providers of the backends `.dstack/backends.yml` configures (just the `only` type
    when given); ConfigError (FILE:LINE:COL) when the file is wrong."""
    providers: list[Provider] = []
    notes: list[str] = []
    for backend in load_backends(project_dir).backends:
        if only is not None and backend.type != only:
            continue
        if backend.type not in CLOUDS:
            continue  # a Slurm cluster runs jobs; it has no machines to offer
        if backend.type not in SHIPPED:
            notes.append(f"{backend.type}: this version has no {backend.type} provider yet")
            continue
        if not _has_module(SDK_MODULE[backend.type]):
            notes.append(
                f"{backend.type}: install the SDK first: pip install 'dstack-plan[{backend.type}]'"
            )
            continue
        cls = provider_class(backend.type)
        providers.append(
            cls(  # type: ignore[call-arg]
                backend,
                project=project_name(project_dir),
                lineage=lineage,
                cache=OfferCache.of(project_dir, backend.type),
                catalog_file=project_catalog_file(project_dir, backend.type),
            )
        )
    if only in CLOUDS and not providers and not notes:
        notes.append(
            f"{only}: not configured in .dstack/backends.yml (dstack init --backend {only})"
        )
    return CloudProviders(providers, notes)


def project_name(project_dir: str | Path) -> str:
    """The project's name in cloud tags: its directory's name, as tag values allow."""
    name = Path(project_dir).resolve().name.lower()
    return re.sub(r"[^a-z0-9_.-]+", "-", name).strip("-") or "project"


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


class ConfiguredClouds:
    """The project's cloud providers for plan and apply: each built once (per state lineage,
    which its tags carry) and closed together.

    Built for planning, a provider has no SSH key (nothing is created); built to create
    machines, it carries the project key's public half (`providers/project_key.py`)."""

    def __init__(self, project_dir: str | Path):
        self.project_dir = Path(project_dir)
        self._built: dict[tuple[str, str, bool], Provider] = {}

    def backend_types(self, fleet_provider: str) -> list[str]:
        """The configured backend types a fleet of `fleet_provider` may use."""
        configured = load_backends(self.project_dir).backends
        types: list[str] = [b.type for b in configured if b.type in CLOUDS]
        return types if fleet_provider == ANY_CLOUD else [t for t in types if t == fleet_provider]

    def cannot_create(self, fleet_provider: str) -> str | None:
        """Why no fleet of `fleet_provider` can be created (not configured, no provider yet,
        no SDK); None when one can. ConfigError when `.dstack/backends.yml` is wrong."""
        if fleet_provider != ANY_CLOUD and fleet_provider not in CLOUDS:
            return f"the {fleet_provider} provider cannot create fleets in this version"
        usable = cloud_providers(self.project_dir, only=_only(fleet_provider))
        if usable.providers:
            return None
        if usable.notes:
            return "; ".join(usable.notes)
        wanted = (
            "a cloud backend" if fleet_provider == ANY_CLOUD else f"the {fleet_provider} backend"
        )
        hint = "aws" if fleet_provider == ANY_CLOUD else fleet_provider
        return f"{wanted} is not configured in .dstack/backends.yml (dstack init --backend {hint})"

    def providers(self, fleet_provider: str, lineage: str, *, creating: bool) -> list[Provider]:
        """The usable providers of the backends a `fleet_provider` fleet may use."""
        return [
            self.provider(t, lineage, creating=creating)
            for t in self.backend_types(fleet_provider)
            if t in SHIPPED and _has_module(SDK_MODULE[t])
        ]

    def provider(self, backend_type: str, lineage: str, *, creating: bool) -> Provider:
        """The provider of the configured backend `backend_type`."""
        key = (backend_type, lineage, creating)
        if key not in self._built:
            config = load_backends(self.project_dir).get(backend_type)
            if config is None or backend_type not in SHIPPED:
                raise ProviderError(
                    backend_type, "not configured in .dstack/backends.yml (dstack init --backend)"
                )
            kwargs: dict[str, Any] = {
                "project": project_name(self.project_dir),
                "lineage": lineage,
                "cache": OfferCache.of(self.project_dir, backend_type),
                "catalog_file": project_catalog_file(self.project_dir, backend_type),
            }
            if creating:
                kwargs["ssh_public_key"] = project_key(self.project_dir).public_openssh
            self._built[key] = provider_class(backend_type)(config, **kwargs)  # type: ignore[call-arg]
        return self._built[key]

    def ssh_user(self, backend_type: str) -> str:
        """The user the machines of `backend_type` are logged in as."""
        config = load_backends(self.project_dir).get(backend_type)
        return getattr(config, "ssh_user", "ubuntu")

    async def close(self) -> None:
        for provider in self._built.values():
            await provider.close()
        self._built.clear()


def _only(fleet_provider: str) -> str | None:
    return None if fleet_provider == ANY_CLOUD else fleet_provider
