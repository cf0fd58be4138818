"""How fast a `resources:` block validates: 10,000 validations of a typical block.

Every run and fleet validates one when a project loads, so a large project pays it per
resource. Target: 10,000 validations within 1 s (the fastest of `--repeats` runs). The unit
tests check what validation answers; the time is measured here, where a busy machine is a
reading, not a failure.

    python benchmarks/resources_validation.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dstack_plan.config.resources import ResourcesSpec  # noqa: E402

BLOCK = {"cpu": "16..", "memory": "200GB..", "disk": "500GB..", "gpu": "A100:80GB:2"}
COUNT = 10_000
TARGET_SECONDS = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = timeit.repeat(
        lambda: ResourcesSpec.model_validate(BLOCK), number=COUNT, repeat=args.repeats
    )
    best = min(runs)
    ok = best < TARGET_SECONDS
    print(
        f"{COUNT:,} validations of a resources block: best {best:.3f} s of {args.repeats} "
        f"(target < {TARGET_SECONDS:.0f} s) -> {'OK' if ok else 'OVER'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
