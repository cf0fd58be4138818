"""scripts/check_layers.py, the import rules `make lint` enforces: it finds what it must."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts/check_layers.py")
assert _spec is not None and _spec.loader is not None
check_layers = importlib.util.module_from_spec(_spec)
sys.modules["check_layers"] = check_layers
_spec.loader.exec_module(check_layers)
Import = check_layers.Import


def edge(source: str, target: str, line: int = 1) -> object:
    return Import(source, target, ROOT / "dstack_plan" / "x.py", line)


def test_an_import_that_climbs_a_layer_is_named_with_its_line() -> None:
    found = check_layers.upward([edge("dstack_plan.plan.model", "dstack_plan.sdk.html", 205)])
    assert found == [
        "dstack_plan/x.py:205: dstack_plan.plan.model imports dstack_plan.sdk.html"
        " (up: plan → sdk)"
    ]


def test_down_and_sideways_imports_pass() -> None:
    edges = [
        edge("dstack_plan.runs.handler", "dstack_plan.fleets.machines"),
        edge("dstack_plan.apply.engine", "dstack_plan.plan.model"),
        edge("dstack_plan.agent.client", "dstack_plan.errors"),
    ]
    assert check_layers.upward(edges) == []
    assert check_layers.circles(edges) == []


def test_the_agent_imports_nothing_of_the_controller() -> None:
    found = check_layers.upward([edge("dstack_plan.agent.jobs", "dstack_plan.config.units")])
    assert found and "agent stands alone" in found[0]


def test_circles_of_modules_and_of_packages_side_by_side() -> None:
    modules = [
        edge("dstack_plan.state.backend", "dstack_plan.state.lock"),
        edge("dstack_plan.state.lock", "dstack_plan.state.backend"),
    ]
    assert check_layers.circles(modules) == [
        ["dstack_plan.state.backend", "dstack_plan.state.lock"]
    ]
    packages = [
        edge("dstack_plan.config.backends", "dstack_plan.state.atomic"),
        edge("dstack_plan.state.backend_config", "dstack_plan.config.fleet"),
    ]
    assert check_layers.circles(packages) == [["config", "state"]]


def test_imports_inside_functions_and_under_type_checking_count(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dstack_plan.sdk import html\n"
        "def f():\n    from dstack_plan.watch.loop import run\n"
    )
    modules = {"dstack_plan.plan.model", "dstack_plan.sdk.html", "dstack_plan.watch.loop"}
    found = check_layers.imports_of(source, "dstack_plan.plan.model", modules)
    assert [(e.target, e.line) for e in found] == [
        ("dstack_plan.sdk.html", 3),
        ("dstack_plan.watch.loop", 5),
    ]


def test_the_code_follows_the_map() -> None:
    edges = check_layers.collect()
    assert check_layers.upward(edges) == []
    assert check_layers.circles(edges) == []
