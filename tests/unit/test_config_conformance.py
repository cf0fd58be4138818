"""Real configurations from dstack's repository must be accepted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from tests.conftest import SHARED_DIR

CONFORMANCE_DIR = SHARED_DIR / "conformance" / "dstack-examples"


def conformance_files() -> list[Path]:
    if not CONFORMANCE_DIR.is_dir():
        return []
    return sorted(p for p in CONFORMANCE_DIR.iterdir() if p.name.endswith((".yml", ".yaml")))


def test_conformance_folder_is_present() -> None:
    if not CONFORMANCE_DIR.is_dir():
        reason = f"conformance configs not found at {CONFORMANCE_DIR}"
        if os.environ.get("DSTACK_PLAN_REQUIRE_CONFORMANCE") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    assert conformance_files()


@pytest.mark.parametrize("path", conformance_files(), ids=lambda p: p.name)
def test_conformance_config_validates(path: Path) -> None:
    desired = load_project(path.parent, [path])
    assert len(desired) >= 1
