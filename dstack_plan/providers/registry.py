"""Find providers by name through the `dstack_plan.providers` entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from dstack_plan.errors import ProviderError
from dstack_plan.providers.base import Provider

GROUP = "dstack_plan.providers"


def provider_class(name: str) -> type[Provider]:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        known = ", ".join(sorted(ep.name for ep in entry_points(group=GROUP))) or "none"
        raise ProviderError(name, f"no such provider is installed (installed: {known})")
    cls = found[0].load()
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise ProviderError(name, f"entry point {found[0].value} is not a Provider class")
    return cls


def create_provider(name: str, **options: Any) -> Provider:
    return provider_class(name)(**options)
