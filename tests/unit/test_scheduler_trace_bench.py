"""The trace benchmark runs on a small sample of the Alibaba trace and prints the documented
JSON shape; `ours` there is the scheduler's own scoring."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data" / "alibaba-gpu-v2023"
POLICIES = {"ours", "fgd", "best_fit", "first_fit", "random_fit", "dot_product"}


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "scheduler_trace", ROOT / "benchmarks/scheduler_trace.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scheduler_trace"] = module
    spec.loader.exec_module(module)
    return module


def sample(source: Path, target: Path, rows: int, step: int) -> Path:
    with source.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        kept = [r for i, r in enumerate(reader) if i % step == 0][:rows]
    with target.open("w", newline="") as f:
        csv.writer(f).writerows([header, *kept])
    return target


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = sample(DATA / "openb_node_list_gpu_node.csv", tmp_path / "nodes.csv", 60, 20)
    pods = sample(DATA / "openb_pod_list_default.csv", tmp_path / "pods.csv", 400, 20)
    return nodes, pods


def test_the_benchmark_prints_the_documented_shape(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    module = bench()
    module.QUEUE = 500  # type: ignore[attr-defined]  # the decision timing's queue, small for a unit test
    nodes, pods = trace
    assert module.main(["--nodes", str(nodes), "--pods", str(pods), "--json", "--seed", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"inflation", "replay", "decision_ms", "place_ms"}
    for mode in ("whole", "shared"):
        table = result["inflation"][mode]
        assert set(table) == POLICIES
        for row in table.values():
            assert set(row) == {"80", "90", "100", "110"}
            assert all(0 <= v <= 100 for v in row.values())
            assert row["80"] >= row["110"] - 1e-9  # more arrived, no less allocated
    assert set(result["replay"]) == POLICIES
    for row in result["replay"].values():
        assert set(row) == {"mean_delay_s", "p95_delay_s", "mean_gpu_alloc_pct"}
    assert result["decision_ms"] > 0
    assert result["place_ms"] > 0


def test_ours_is_the_schedulers_scoring_and_beats_first_fit_on_shared_gpus(
    trace: tuple[Path, Path],
) -> None:
    module = bench()
    from dstack_plan.scheduler import packing

    assert module.Scorer is packing.Scorer and module.fits is packing.fits
    nodes, pods = (module.load_nodes(trace[0]), module.load_pods(trace[1]))
    table = module.inflation(nodes, pods, 3, shared=True)
    assert table["ours"]["110"] <= table["first_fit"]["110"] + 0.5
    assert table["ours"]["110"] <= table["random_fit"]["110"]
