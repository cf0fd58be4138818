"""docs/architecture.md is the package map: every module and package it names exists, and
every top-level package appears in it, so the map cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "dstack_plan"


def named_paths() -> set[str]:
    text = DOC.read_text()
    return set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*(?:\.py|/))`", text))


def test_every_path_the_map_names_exists() -> None:
    missing = []
    for path in sorted(named_paths()):
        candidates = [ROOT / path, PACKAGE / path]
        candidates += [p / path for p in PACKAGE.iterdir() if p.is_dir()]
        if not any(c.exists() for c in candidates):
            missing.append(path)
    assert missing == []


def test_every_package_is_on_the_map() -> None:
    packages = {
        p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    modules = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert (packages | modules) - named_paths() == set()
