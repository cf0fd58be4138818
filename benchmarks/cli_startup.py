"""Whole-process wall time of the `dstack` console script: `--help`, and `plan` on a small project.

The installed console script (`<venv>/bin/dstack`) runs as a subprocess, as a user runs it: the
median of N runs of each, alternating. `plan` is a 3-resource project (a task, a service and a
dev environment, no state yet) on the local fleet. It is timed twice: as a new user runs it,
with no agent running and none ever started (plan then gathers host facts in-process and
starts no agent), and with the local agent running (started before the timed runs), when it
asks the agent for host facts and its jobs. Both load, place the runs and print the plan.

Bytecode: an installed package has its `.pyc` files, so the headline runs with a bytecode cache
(`PYTHONPYCACHEPREFIX` in a temp dir, filled by the warm-up runs). The last column repeats the
runs the way this sandbox runs Python (`PYTHONDONTWRITEBYTECODE=1` and no `.pyc` files for
`dstack_plan`, so every run compiles its modules).

Targets: `--help` under 0.25 s, `plan` under 0.5 s. (dstack's own CLI takes ~1 s for `--help`.)
Two reference rows put them in proportion: an empty Python process, and one that only imports
the libraries `dstack plan` needs (pydantic, typer, asyncio, h11, PyYAML; rich only on a
terminal) and builds one pydantic model.

With `--dstack-cli PATH` (dstack's own console script, e.g. 0.22.5 installed in a venv of its
own: `python3 -m venv /tmp/d && /tmp/d/bin/pip install dstack==0.22.5`), its `--help` is timed
in the same alternation, and our `plan` must take under half of it.

    python benchmarks/cli_startup.py [-n 10] [--dstack-cli PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"--help": 0.25, "plan": 0.5, "plan (agent up)": 0.5}
THEIRS = "(dstack's --help)"
PROJECT = """\
type: task
name: hello
commands:
  - echo hi
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
---
type: service
name: web
commands:
  - python3 -m http.server 8000
port: 8000
resources: {cpu: 1.., memory: 0.1GB..}
---
type: dev-environment
name: dev
ide: vscode
resources: {cpu: 1..}
"""


def console_script() -> Path:
    script = Path(sys.executable).parent / "dstack"
    if not script.exists():
        raise SystemExit(f"{script} not found: install the project (pip install -e .)")
    return script


def run(argv: list[str], cwd: Path, env: dict[str, str], expect: str) -> float:
    """Seconds one run of `argv` takes; exits if it fails or does not print `expect`."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout:
        command = " ".join(argv)
        raise SystemExit(f"{command} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return elapsed


LIBRARIES = """\
import asyncio, h11, pydantic, typer, yaml
class Model(pydantic.BaseModel):
    a: int
print(Model(a=1).a)
"""
"""What `dstack plan` imports from other projects, and the first pydantic model it builds."""


def measure(
    script: Path,
    project: Path,
    env: dict[str, str],
    agent_dir: Path,
    n: int,
    theirs: Path | None = None,
) -> dict[str, list[float]]:
    """Times of each command; `agent_dir` is where an agent runs (env's dir has none)."""
    planned = "Plan: 3 to add, 0 to change, 0 to destroy."
    with_agent = {**env, "DSTACK_PLAN_AGENT_DIR": str(agent_dir)}
    commands = {
        "--help": ([str(script), "--help"], "Usage", env),
        "plan": ([str(script), "plan"], planned, env),
        "plan (agent up)": ([str(script), "plan"], planned, with_agent),
        # references, no targets: how much of the budget is not ours to spend
        "(python)": ([sys.executable, "-c", "print(1)"], "1", env),
        "(libraries)": ([sys.executable, "-c", LIBRARIES], "1", env),
    }
    if theirs is not None:
        commands[THEIRS] = ([str(theirs), "--help"], "Usage", env)
    for argv, expect, run_env in commands.values():  # warm-up: bytecode and page cache
        for _ in range(2):
            run(argv, project, run_env, expect)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(n):
        for name, (argv, expect, run_env) in commands.items():
            times[name].append(run(argv, project, run_env, expect))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=10, help="timed runs of each command")
    parser.add_argument("--dstack-cli", type=Path, help="dstack's own console script")
    args = parser.parse_args()
    script = console_script()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        project = tmp / "project"
        project.mkdir()
        (project / "app.dstack.yml").write_text(PROJECT)
        agent_dir = tmp / "agent"
        base = {k: v for k, v in os.environ.items() if not k.startswith("DSTACK_")}
        base.update(NO_COLOR="1", COLUMNS="120", DSTACK_PLAN_AGENT_DIR=str(tmp / "no-agent"))
        cached = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        sandbox = {**base, "PYTHONDONTWRITEBYTECODE": "1"}
        sandbox.pop("PYTHONPYCACHEPREFIX", None)
        agent = [sys.executable, "-m", "dstack_plan.agent"]
        subprocess.run([*agent, "start", "--data-dir", str(agent_dir)], check=True, timeout=60)
        try:
            with_cache = measure(script, project, cached, agent_dir, args.n, args.dstack_cli)
            without_cache = measure(script, project, sandbox, agent_dir, args.n, args.dstack_cli)
        finally:
            subprocess.run(
                [*agent, "stop", "--data-dir", str(agent_dir)], capture_output=True, timeout=60
            )
    header = ("command", "median s", "min s", "max s", "target", "no .pyc")
    print("{:<24} {:>9} {:>7} {:>7} {:>7}  {:>8}".format(*header))
    for name, values in with_cache.items():
        label = f"dstack {name}" if name in TARGETS else name
        target = f"{TARGETS[name]:.2f}" if name in TARGETS else "-"
        print(
            f"{label:<24} {statistics.median(values):>9.3f} {min(values):>7.3f} "
            f"{max(values):>7.3f} {target:>7}  {statistics.median(without_cache[name]):>8.3f}"
        )
    medians = {name: statistics.median(with_cache[name]) for name in TARGETS}
    ok = all(medians[name] < target for name, target in TARGETS.items())
    print(
        f"dstack --help {medians['--help']:.3f} s (target < {TARGETS['--help']} s), "
        f"dstack plan {medians['plan']:.3f} s, "
        f"with the agent up {medians['plan (agent up)']:.3f} s (target < {TARGETS['plan']} s), "
        f"median of {args.n} -> {'OK' if ok else 'MISS'}"
    )
    if args.dstack_cli is not None:
        theirs = statistics.median(with_cache[THEIRS])
        ratio = medians["plan"] / theirs
        print(
            f"dstack plan {medians['plan']:.3f} s vs dstack's own --help {theirs:.3f} s: "
            f"{ratio:.2f}x (target < 0.5x) -> {'OK' if ratio < 0.5 else 'MISS'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
