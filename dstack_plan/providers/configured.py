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
from typing import NamedTuple

from dstack_plan.config.backends import load_backends
from dstack_plan.providers.base import Provider
from dstack_plan.providers.registry import provider_class

SDK_MODULE = {"aws": "boto3", "gcp": "google.cloud.compute", "azure": "azure.mgmt.compute"}
"""The module each provider's SDK extra installs (`pip install 'dstack-plan[aws]'`)."""
CLOUDS = frozenset(SDK_MODULE)
"""The backend types `.dstack/backends.yml` takes: built with their configuration only."""
SHIPPED = frozenset({"aws"})
"""Cloud providers this version has; the other backend types are configured ahead of them."""


class CloudProviders(NamedTuple):
    providers: list[Provider]
    notes: list[str]
    """A line per configured backend that cannot be used, saying why."""


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
            cls(backend, project=project_name(project_dir), lineage=lineage)  # type: ignore[call-arg]
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
