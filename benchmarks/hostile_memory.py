"""Peak memory of `dstack validate` and `dstack plan` on hostile configurations under 1 MB.

Each input is one file just under 1 MB built to be expensive: tens of thousands of ports (valid
and out of range), env entries, commands, labels, deeply nested flow mappings, many small
documents. Each command runs in a fresh process (the child's `ru_maxrss` from `os.wait4`).
Target: `validate` peaks under 150 MB on each. `plan` is shown beside it: its `documents`
input is 34,000 resources, a project plan_scale.py measures as such (not a hostile input).

    python benchmarks/hostile_memory.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

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


def main() -> int:
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
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dstack_plan.agent",
                "stop",
                "--data-dir",
                env["DSTACK_PLAN_AGENT_DIR"],
            ],
            capture_output=True,
        )
    print(f"{'shape':<10} {'bytes':>9} {'command':<9} {'peak MB':>8} {'exit':>4}")
    for name, size, command, peak, code in rows:
        print(f"{name:<10} {size:>9} {command:<9} {peak:>8.1f} {code:>4}")
    worst = max(r[3] for r in rows if r[2] == "validate")
    verdict = "OK" if worst < TARGET_MB else "OVER"
    print(f"validate, hostile inputs under 1 MB: peak {worst:.0f} MB")
    print(f"target < {TARGET_MB:.0f} MB -> {verdict}")
    return 0 if worst < TARGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())
