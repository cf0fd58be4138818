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
in the same alternation, and our `plan` must take under half of it. With `--dstack-home DIR`
too (a HOME whose `~/.dstack/config.yml` points at a running `dstack server` of that version,
which starts offline: `HOME=DIR dstack server --host 127.0.0.1`), its plan of the same task is
timed as well: `dstack apply -f task.dstack.yml` answered `n` at its "Submit the run?" prompt,
which it shows after asking the server for the plan and printing it.

    python benchmarks/cli_startup.py [-n 10] [--dstack-cli PATH [--dstack-home DIR]]
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
THEIR_PLAN = "(dstack's plan)"
TASK = """\
type: task
name: hello
commands:
  - echo hi
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""
"""The project's task: alone, what dstack's `apply -f` is given (it takes one configuration)."""
PROJECT = (
    TASK
    + """\
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
)


def console_script() -> Path:
    script = Path(sys.executable).parent / "dstack"
    if not script.exists():
        raise SystemExit(f"{script} not found: install the project (pip install -e .)")
    return script


def run(
    argv: list[str], cwd: Path, env: dict[str, str], expect: str, answer: str | None = None
) -> float:
    """Seconds one run of `argv` takes (`answer` on its stdin); exits if it fails or does not
    print `expect`."""
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, input=answer
    )
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
    their_home: Path | None = None,
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
    cwd = dict.fromkeys(commands, project)
    if theirs is not None and their_home is not None:
        their_project = project.parent / "theirs"
        their_project.mkdir(exist_ok=True)
        (their_project / "task.dstack.yml").write_text(TASK)
        their_env = {**env, "HOME": str(their_home)}
        argv = [str(theirs), "apply", "-f", "task.dstack.yml"]
        commands[THEIR_PLAN] = (argv, "Submit the run", their_env)
        cwd[THEIR_PLAN] = their_project
    answers = {THEIR_PLAN: "n\n"}
    for name, (argv, expect, run_env) in commands.items():  # warm-up: bytecode, page cache
        for _ in range(2):
            run(argv, cwd[name], run_env, expect, answers.get(name))
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(n):
        for name, (argv, expect, run_env) in commands.items():
            times[name].append(run(argv, cwd[name], run_env, expect, answers.get(name)))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=10, help="timed runs of each command")
    parser.add_argument("--dstack-cli", type=Path, help="dstack's own console script")
    parser.add_argument(
        "--dstack-home", type=Path, help="a HOME whose dstack config names a running dstack server"
    )
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
            theirs = (args.dstack_cli, args.dstack_home)
            with_cache = measure(script, project, cached, agent_dir, args.n, *theirs)
            without_cache = measure(script, project, sandbox, agent_dir, args.n, *theirs)
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
    if THEIR_PLAN in with_cache:
        their_plan = statistics.median(with_cache[THEIR_PLAN])
        print(
            f"dstack plan {medians['plan']:.3f} s vs dstack's own plan of the task "
            f"(apply -f, answered n) {their_plan:.3f} s: {medians['plan'] / their_plan:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
