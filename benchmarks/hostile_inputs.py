"""What hostile configurations cost: the time to answer each, and peak memory under 1 MB.

Times (in process, the fastest of `--repeats` runs): every input of
tests/infra/hostile_configs.py (alias bombs, 25,000 unterminated interpolations, an error
among 100,000 entries, 5,000 bad documents, 70,000 wrong items, 100,000 duplicate keys)
loaded, and 5,000 reference errors validated. Target: each answered within 2 s. The unit tests
check what each is answered with; the time is measured here, where a busy machine is a
reading, not a failure.

Memory: one file just under 1 MB built to be expensive (tens of thousands of ports, env
entries, commands, small documents, deep nesting), `dstack validate` and `dstack plan` each in a
fresh process (the child's `ru_maxrss` from `os.wait4`). Target: `validate` under 150 MB on
each. `plan` is shown beside it: its `documents` input is 34,000 resources, a project
plan_scale.py measures as such (not a hostile input).

    python benchmarks/hostile_inputs.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.infra.hostile_configs import LOAD_CASES, REFERENCE_ERRORS  # noqa: E402

TARGET_SECONDS = 2.0
TARGET_MB = 150.0
LIMIT_BYTES = 1_000_000


def _ports(n: int) -> str:
    ports = "\n".join(f"  - {(p % 65546) + 1}" for p in range(n))
    return f"type: dev-environment\nname: de\nide: vscode\nports:\n{ports}\n"


def _env(n: int) -> str:
    env = "\n".join(f"  - VAR_{i}=value-{i}" for i in range(n))
    return f'type: task\nname: te\ncommands: ["true"]\nenv:\n{env}\n'


def _commands(n: int) -> str:
    commands = "\n".join(f'  - "echo {i} && true"' for i in range(n))
    return f"type: task\nname: tc\ncommands:\n{commands}\n"


def _documents(n: int) -> str:
    return "---\n".join(f'type: task\nname: t{i}\ncommands: ["true"]\n' for i in range(n))


def _nested(n: int) -> str:
    depth = min(n, 5000)
    return 'type: task\nname: tn\ncommands: ["true"]\nenv: ' + "[" * depth + "]" * depth + "\n"


SHAPES: dict[str, Callable[[int], str]] = {
    "ports": _ports,
    "env": _env,
    "commands": _commands,
    "documents": _documents,
    "nested": _nested,
}


def _largest_under_limit(make: Callable[[int], str]) -> str:
    low, high = 1, 1
    while len(make(high).encode()) < LIMIT_BYTES and high < 10_000_000:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if len(make(middle).encode()) < LIMIT_BYTES:
            low = middle
        else:
            high = middle
    return make(low)


def _peak_mb(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    process = subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(process.pid, 0)
    return usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def _fastest(call: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _validate(directory: Path) -> None:
    from dstack_plan.config.loader import load_project
    from dstack_plan.errors import ConfigError
    from dstack_plan.plan.limits import checked_dependencies

    try:
        checked_dependencies(load_project(directory), directory)
    except ConfigError:
        pass  # the errors are the point: what they cost is what is timed


def times(repeats: int) -> list[tuple[str, int, float]]:
    """(case, bytes, fastest seconds) of each hostile input."""
    from dstack_plan.config.loader import load_text

    rows = []
    for name, text in LOAD_CASES.items():
        rows.append(
            (name, len(text.encode()), _fastest(lambda t=text: load_text(t, "h.yml"), repeats))
        )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "runs.dstack.yml").write_text(REFERENCE_ERRORS)
        seconds = _fastest(lambda: _validate(Path(tmp)), repeats)
    rows.append(("5,000 reference errors (validate)", len(REFERENCE_ERRORS.encode()), seconds))
    return rows


def memory() -> list[tuple[str, int, str, float, int]]:
    """(shape, bytes, command, peak MB, exit code) of each file under 1 MB."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DSTACK_PLAN_AGENT_DIR": str(Path(tmp) / "agent")}
        for name, make in SHAPES.items():
            project = Path(tmp) / name
            project.mkdir()
            text = _largest_under_limit(make)
            (project / "h.dstack.yml").write_text(text)
            for command in ("validate", "plan"):
                args = [sys.executable, "-m", "dstack_plan.cli", command, "."]
                peak, code = _peak_mb(args, project, env)
                rows.append((name, len(text.encode()), command, peak, code))
        stop = [sys.executable, "-m", "dstack_plan.agent", "stop", "--data-dir"]
        subprocess.run([*stop, env["DSTACK_PLAN_AGENT_DIR"]], capture_output=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = memory()  # first: a child's peak counts the parent it was forked from
    timed = times(args.repeats)
    print(f"{'input':<40} {'bytes':>9} {'seconds':>8}")
    for name, size, seconds in timed:
        print(f"{name:<40} {size:>9} {seconds:>8.3f}")
    print()
    print(f"{'shape':<10} {'bytes':>9} {'command':<9} {'peak MB':>8} {'exit':>4}")
    for name, size, command, peak, code in rows:
        print(f"{name:<10} {size:>9} {command:<9} {peak:>8.1f} {code:>4}")
    slowest = max(seconds for _, _, seconds in timed)
    worst = max(r[3] for r in rows if r[2] == "validate")
    ok = slowest < TARGET_SECONDS and worst < TARGET_MB
    print(
        f"hostile inputs: slowest answer {slowest:.2f} s (target < {TARGET_SECONDS:.0f} s), "
        f"validate peak {worst:.0f} MB (target < {TARGET_MB:.0f} MB) -> {'OK' if ok else 'OVER'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
