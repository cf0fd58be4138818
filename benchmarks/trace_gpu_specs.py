"""Write a copy of a pods CSV in which a share of the GPU tasks may run only on some GPU models.

The published openb traces include `gpuspec` variants (e.g. `openb_pod_list_gpuspec33.csv`: a
third of the GPU tasks constrained); our data directory ships only the default and multigpu20
files. This makes the same kind of file reproducibly, so `scheduler_trace.py` can be checked on a
trace where naive packing strands scarce models:

    python benchmarks/trace_gpu_specs.py --out /tmp/gpuspec33.csv
    python benchmarks/scheduler_trace.py --pods /tmp/gpuspec33.csv

Each chosen task gets one or two models (`|`-separated, as in the trace), drawn in proportion to
the GPUs of each model in the nodes file, so common models are asked for more often than rare
ones. Tasks that already carry a `gpu_spec` keep it.
"""

from __future__ import annotations

import argparse
import csv
import random
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "alibaba-gpu-v2023"


def gpus_by_model(nodes: Path) -> Counter[str]:
    """How many GPUs the cluster has of each model."""
    counts: Counter[str] = Counter()
    with nodes.open(newline="") as f:
        for row in csv.DictReader(f):
            counts[row["model"]] += int(row["gpu"])
    return counts


def constrain(rows: list[dict[str, str]], models: Counter[str], share: float, seed: int) -> int:
    """Give `share` of the GPU tasks without a gpu_spec a list of models; returns how many."""
    rng = random.Random(seed)
    names = sorted(m for m, n in models.items() if n)
    weights = [models[m] for m in names]
    changed = 0
    for row in rows:
        if int(row["num_gpu"]) == 0 or row.get("gpu_spec") or rng.random() >= share:
            continue
        first = rng.choices(names, weights)[0]
        chosen = {first}
        if rng.random() < 0.5 and len(names) > 1:
            rest = [m for m in names if m != first]
            chosen.add(rng.choices(rest, [models[m] for m in rest])[0])
        row["gpu_spec"] = "|".join(sorted(chosen))
        changed += 1
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--share", type=float, default=1 / 3, help="default: a third")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    with args.pods.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    changed = constrain(rows, gpus_by_model(args.nodes), args.share, args.seed)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{args.out}: {changed} of {len(rows)} tasks constrained to GPU models")


if __name__ == "__main__":
    main()
