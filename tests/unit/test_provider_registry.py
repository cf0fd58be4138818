"""Providers are found by name through the `dstack_plan.providers` entry-point group."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.errors import ProviderError
from dstack_plan.providers.local import LocalProvider
from dstack_plan.providers.registry import create_provider, provider_class


def test_the_installed_local_provider_is_found_by_name(tmp_path: Path) -> None:
    assert provider_class("local") is LocalProvider
    provider = create_provider("local", agent_dir=tmp_path)
    assert isinstance(provider, LocalProvider)
    assert provider.agent_dir == tmp_path


def test_an_unknown_provider_names_the_installed_ones() -> None:
    with pytest.raises(ProviderError, match=r"no such provider is installed \(installed: .*local"):
        provider_class("vultr")
