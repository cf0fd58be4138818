"""Two `dstack watch` processes on one state: one leads; when it is killed (SIGKILL, mid-tick
or not) the other takes over within the lease's 15 s and acts, and the jobs run on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import task


def lease_pid(project: Path) -> int | None:
    path = project / ".dstack" / "watch-lease.json"
    try:
        return int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def start_watch(project: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dstack_plan.cli", "watch", "--interval", "0.5s"],
        cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_until(condition, timeout: float, what: str) -> float:  # noqa: ANN001
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, what
        time.sleep(0.1)
    return time.monotonic() - started


def test_the_standby_takes_over_from_a_killed_leader(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "long.dstack.yml").write_text(task("long", "sleep 120"))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.long", {"running"})
    first = start_watch(project, cli_env)
    try:
        wait_until(lambda: lease_pid(project) == first.pid, 15, "the first watch never led")
        second = start_watch(project, cli_env)
        try:
            time.sleep(2)
            assert lease_pid(project) == first.pid  # the standby does not take a live lease
            first.send_signal(signal.SIGKILL)
            first.wait(5)
            (project / "short.dstack.yml").write_text(task("short", "true"))
            assert dstack("apply", "-y").returncode == 0  # apply runs beside watch
            took = wait_until(lambda: lease_pid(project) == second.pid, 30, "no takeover")
            assert took < 20  # a 15 s lease, renewed every 0.5 s
            # it acts: the short task's end is committed to state by the new leader
            wait_until(
                lambda: state(project)["resources"]["task.short"]["status"] == "done",
                10,
                "the new leader did not commit the finished run",
            )
            # the jobs outlived the killed watch
            assert state(project)["resources"]["task.long"]["status"] == "running"
        finally:
            second.send_signal(signal.SIGINT)
            assert second.wait(15) == 0, second.stderr.read() if second.stderr else ""
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
    assert dstack("destroy", "-y").returncode == 0
