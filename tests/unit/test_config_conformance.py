"""Real configurations from dstack's repository must be accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from tests.conftest import DSTACK_EXAMPLES


def conformance_files() -> list[Path]:
    return sorted(p for p in DSTACK_EXAMPLES.iterdir() if p.name.endswith((".yml", ".yaml")))


def test_the_conformance_configs_are_in_the_repository() -> None:
    assert len(conformance_files()) >= 15


@pytest.mark.parametrize("path", conformance_files(), ids=lambda p: p.name)
def test_conformance_config_validates(path: Path) -> None:
    desired = load_project(path.parent, [path])
    assert len(desired) >= 1
