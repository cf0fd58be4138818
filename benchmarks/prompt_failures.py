"""How long a user waits for a failure or an interruption to end a command, and for a standby
`dstack watch` to take over.

The tests assert what ends each of these waits (a refusal, not a timeout; a cancellation; a
holder seen gone, not a lease run out); how long that takes is measured here:
- `s3-dead-endpoint`: reading the state from an S3 endpoint that refuses connections
  (botocore's few attempts, then a StateError). Target < 10 s.
- `agent-refused`: an agent client with its default retries and backoff, against a port
  nobody listens on, gives up. Target < 2 s.
- `apply-ctrl-c-twice`: an apply (the engine with the CLI's signal handlers, in its own
  process) whose two creates never return, interrupted twice: from the second SIGINT to the
  process's exit. Target < 5 s.
- `watch-takeover`: two `dstack watch` processes (default interval, 5 s) on one project; the
  leader is SIGKILLed: from then until the standby holds the leader lease. Target < 20 s (the
  lease, 15 s, plus a tick; a standby that sees the leader's process gone takes over at its
  next tick).

Each runs --rounds times (alternating); the median and the worst are reported.

    python benchmarks/prompt_failures.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dstack_plan.agent.client import AgentClient  # noqa: E402
from dstack_plan.errors import AgentError, StateError  # noqa: E402
from dstack_plan.state.s3 import S3Backend  # noqa: E402
from dstack_plan.state.s3_location import S3Location  # noqa: E402

TARGETS = {
    "s3-dead-endpoint": 10.0,
    "agent-refused": 2.0,
    "apply-ctrl-c-twice": 5.0,
    "watch-takeover": 20.0,
}
CLI = [sys.executable, "-m", "dstack_plan.cli"]
NET = 120.0
"""Seconds after which a scenario is given up on (reported as that long)."""


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def s3_dead_endpoint() -> float:
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    where = S3Location.from_url(
        f"s3://bench/state.json?region=us-east-1&endpoint_url=http://127.0.0.1:{closed_port()}"
    )
    backend = S3Backend(where)
    backend.objects.client  # noqa: B018 - the client is made outside the measurement
    started = time.perf_counter()
    try:
        backend.read()
    except StateError:
        return time.perf_counter() - started
    raise AssertionError("a dead endpoint answered")


def agent_refused() -> float:
    async def attempt() -> float:
        client = AgentClient(f"http://127.0.0.1:{closed_port()}", "token")
        started = time.perf_counter()
        try:
            await client.health()
        except AgentError:
            return time.perf_counter() - started
        raise AssertionError("nobody listens, yet the agent answered")

    return asyncio.run(attempt())


APPLY_SCRIPT = ROOT / "tests" / "infra" / "apply_until_released.py"
"""Creates that wait for a release file this benchmark never makes."""


def _read_until(proc: subprocess.Popen[str], wanted: Callable[[str], bool]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if wanted(line):
            return
    raise AssertionError("the apply ended before it said what was awaited")


def apply_ctrl_c_twice() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, str(APPLY_SCRIPT)]
            + [str(Path(tmp) / name) for name in ("state.json", "report.json", "never")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            started: set[str] = set()

            def both_started(line: str) -> bool:
                if line.startswith("started "):
                    started.add(line.split()[1])
                return len(started) == 2

            _read_until(proc, both_started)
            proc.send_signal(signal.SIGINT)
            _read_until(proc, lambda line: line.startswith("event interrupt"))
            began = time.perf_counter()
            proc.send_signal(signal.SIGINT)
            proc.wait(NET)
            return time.perf_counter() - began
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _lease_pid(project: Path) -> int | None:
    try:
        return int(json.loads((project / ".dstack" / "watch-lease.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _ticks(metrics: Path) -> int:
    try:
        for line in metrics.read_text().splitlines():
            if line.startswith("dstack_reconcile_duration_seconds_count "):
                return int(float(line.split()[1]))
    except OSError:
        pass
    return 0


def _poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + NET
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.01)


def watch_takeover() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "task.dstack.yml").write_text("type: task\nname: t\ncommands: [echo hi]\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DSTACK_")}
        env.update(DSTACK_PLAN_AGENT_DIR=str(Path(tmp) / "agent"), PYTHONPATH=str(ROOT))
        metrics = Path(tmp) / "standby.prom"

        def watch(*extra: str) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [*CLI, "watch", *extra], cwd=project, env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip

        leader = watch()
        standby = None
        try:
            _poll(lambda: _lease_pid(project) == leader.pid, "the first watch never led")
            standby = watch("--metrics-file", str(metrics))
            _poll(lambda: _ticks(metrics) >= 1, "the standby never ticked")
            leader.send_signal(signal.SIGKILL)
            leader.wait()
            began = time.perf_counter()
            _poll(lambda: _lease_pid(project) == standby.pid, "no takeover")
            return time.perf_counter() - began
        finally:
            for proc in (leader, standby):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()


SCENARIOS: dict[str, Callable[[], float]] = {
    "s3-dead-endpoint": s3_dead_endpoint,
    "agent-refused": agent_refused,
    "apply-ctrl-c-twice": apply_ctrl_c_twice,
    "watch-takeover": watch_takeover,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    for _ in range(args.rounds):
        for name, scenario in SCENARIOS.items():
            seconds[name].append(scenario())
    print(f"{'scenario':<20} {'median s':>9} {'worst s':>8} {'target s':>9}")
    missed = []
    for name, runs in seconds.items():
        worst = max(runs)
        if worst >= TARGETS[name]:
            missed.append(name)
        print(
            f"{name:<20} {statistics.median(runs):>9.2f} {worst:>8.2f} {TARGETS[name]:>9.0f}"
            + ("  MISS" if worst >= TARGETS[name] else "")
        )
    share = max(max(runs) / TARGETS[name] for name, runs in seconds.items())
    print(
        f"prompt failures: {len(SCENARIOS) - len(missed)} of {len(SCENARIOS)} within target, "
        f"worst at {share:.0%} of its target (target < 100%) -> {'MISS' if missed else 'OK'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
