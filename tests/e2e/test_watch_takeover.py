"""Two `dstack watch` processes on one state: one leads; when it is killed (SIGKILL, mid-tick
or not) the other takes over, without waiting out the killed one's lease (its process is
gone), and acts, and the jobs run on. How long a takeover takes:
benchmarks/prompt_failures.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dstack_plan.cli.watch_cmd import LEASE_ENV
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import task
from tests.infra.watch_metrics import last_tick, ticks_done


def lease_pid(project: Path) -> int | None:
    path = project / ".dstack" / "watch-lease.json"
    try:
        return int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


NET = 120.0
"""Seconds a test waits for what must happen before concluding it will not (a safety net:
passing never waits it out)."""


def start_watch(
    project: Path, env: dict[str, str], metrics: Path | None = None
) -> subprocess.Popen[str]:
    extra = [] if metrics is None else ["--metrics-file", str(metrics)]
    return subprocess.Popen(
        [sys.executable, "-m", "dstack_plan.cli", "watch", "--interval", "0.5s", *extra],
        cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_until(condition, timeout: float, what: str) -> None:  # noqa: ANN001
    """Poll `condition` until it holds; `timeout` is a safety net, never a bound."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_standby_takes_over_from_a_killed_leader(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    # leases of an hour: the standby can only take over by seeing the leader's process gone,
    # not by its lease running out (that path: tests/unit/test_watch_lease.py)
    cli_env[LEASE_ENV] = "1h"
    (project / "long.dstack.yml").write_text(task("long", "sleep 600"))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.long", {"running"}, timeout=NET)
    first = start_watch(project, cli_env)
    try:
        wait_until(lambda: lease_pid(project) == first.pid, NET, "the first watch never led")
        standby = tmp_path / "standby.prom"
        second = start_watch(project, cli_env, standby)
        try:
            # the standby does not take a live lease: it ticks on without leading
            wait_until(lambda: ticks_done(standby) >= 2, NET, "the standby never ticked")
            assert last_tick(standby)[1] is False
            assert lease_pid(project) == first.pid
            first.send_signal(signal.SIGKILL)
            first.wait(NET)
            (project / "short.dstack.yml").write_text(task("short", "true"))
            assert dstack("apply", "-y").returncode == 0  # apply runs beside watch
            wait_until(lambda: lease_pid(project) == second.pid, NET, "no takeover")
            wait_until(lambda: last_tick(standby)[1], NET, "the new leader never reported")
            # it acts: the short task's end is committed to state by the new leader
            wait_until(
                lambda: state(project)["resources"]["task.short"]["status"] == "done",
                NET,
                "the new leader did not commit the finished run",
            )
            # the jobs outlived the killed watch
            assert state(project)["resources"]["task.long"]["status"] == "running"
        finally:
            second.send_signal(signal.SIGINT)
            assert second.wait(NET) == 0, second.stderr.read() if second.stderr else ""
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
    assert dstack("destroy", "-y").returncode == 0
