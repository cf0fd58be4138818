"""`dstack destroy` while `dstack watch` runs, on SSH hosts (network namespaces): nothing is
left running. A tick that read the state before destroy committed must not start the agents
destroy just stopped (watch only talks to agents that run; only apply installs them), nor
start again the jobs of a run destroy is deleting.

The hosts share this machine's process table: the agents left are found by their command line
(`agents_running`), the jobs by a marker in their environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import agents_running, remote, write_fleet  # noqa: F401
from tests.e2e.test_ssh_runs import task
from tests.e2e.test_watch_metrics import samples
from tests.infra.ssh_hosts import SSHTestHosts
from tests.infra.watch_metrics import ticks_done

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

ROUNDS = 12  # three times each of the 4 points of a tick destroy comes at
INTERVAL = "0.2s"
MARK = "DSTACK_PLAN_TEST_DESTROY_RACE"


def wait_ticks(metrics: Path, watch: subprocess.Popen[str], count: int) -> None:
    """Until watch finished `count` more ticks (the first may have begun before)."""
    target = ticks_done(metrics) + count
    deadline = time.monotonic() + 60
    while ticks_done(metrics) < target:
        assert watch.poll() is None, "watch exited"
        assert time.monotonic() < deadline, "watch stopped ticking"
        time.sleep(0.02)


def wait_reached(metrics: Path, watch: subprocess.Popen[str], hosts: int) -> None:
    """Until a tick of watch found `hosts` hosts of the fleet answering (`idle` or `busy`)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            found = samples(metrics.read_text())
            answering = sum(
                found.get(("dstack_instances", (("fleet", "onprem"), ("status", s))), 0.0)
                for s in ("idle", "busy")
            )
            if answering == hosts:
                return
        except OSError:
            pass
        assert watch.poll() is None, "watch exited"
        assert time.monotonic() < deadline, "watch never reached the agents"
        time.sleep(0.02)


def jobs_running(marker: str) -> set[int]:
    """The pids of the processes of this test's jobs (their environment holds `marker`)."""
    needle = f"{MARK}={marker}".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.add(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return found


def agent_pids(remote: Path) -> set[int]:  # noqa: F811
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        prefix = f"{remote}/hosts/".encode()
        if any(w.startswith(prefix) and w.endswith(b"/agent.pyz") for w in words):
            found.add(int(cmdline.parent.name))
    return found


def kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_destroy_beside_watch_leaves_no_agent_and_no_job(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    cli_env: dict[str, str],
) -> None:
    project = tmp_path / "project"
    marker = uuid.uuid4().hex
    write_fleet(project, ssh_hosts, "h1", "h2")
    # retried on error: a run whose jobs destroy stopped must still not be started again
    (project / "long.dstack.yml").write_text(
        task("long", 1, ["sleep 600"], f"env:\n  {MARK}: {marker}\n")
        + "retry: {on_events: [error, interruption], duration: 1h}\n"
    )
    metrics, log = tmp_path / "watch.prom", tmp_path / "watch.log"
    with log.open("w") as stderr:  # not a pipe: nobody reads it while watch runs
        watch = subprocess.Popen(
            [*_cli(), "watch", "--interval", INTERVAL, "--metrics-file", str(metrics)],
            cwd=project, env=cli_env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
        )  # fmt: skip
    leaks: list[tuple[int, set[str], int]] = []
    try:
        for round_ in range(ROUNDS):
            applied = dstack("apply", "-y")
            assert applied.returncode == 0, applied.stdout + applied.stderr
            assert state(project)["resources"]["task.long"]["status"] in (
                "submitted",
                "provisioning",
                "running",
            )
            # watch reaches both agents (it talks to the agents that run) ...
            wait_reached(metrics, watch, 2)
            time.sleep(0.15 * (round_ % 4))  # ... and destroy comes at another point of a tick
            destroyed = dstack("destroy", "-y")
            assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
            wait_ticks(metrics, watch, 3)
            agents, jobs = agents_running(remote), jobs_running(marker)
            if agents or jobs:
                leaks.append((round_, agents, len(jobs)))
                kill(agent_pids(remote) | jobs)  # the next round starts clean
        assert watch.poll() is None, log.read_text()
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(15)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.wait(5)
        kill(agent_pids(remote) | jobs_running(marker))
    # (round, hosts whose agent ran on, job processes left)
    assert leaks == [], f"{len(leaks)} of {ROUNDS} rounds left processes: {leaks}"


def _cli() -> list[str]:
    return [sys.executable, "-m", "dstack_plan.cli"]
