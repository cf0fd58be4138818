"""Faults watch must ride out, with real processes: the local agent killed (SIGKILL) and
started again mid-job, and a `dstack watch` process killed mid-tick and started again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.liveness import read_pid
from dstack_plan.cli.watch_cmd import LEASE_ENV
from dstack_plan.clock import FakeClock
from dstack_plan.errors import DstackPlanError
from dstack_plan.project import Project
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES, alive, task
from tests.e2e.test_watch_retry import flaky
from tests.e2e.test_watch_takeover import NET, lease_pid, wait_until
from tests.infra.docker_images import ensure_busybox_image

pytestmark = pytest.mark.docker


def container_task(name: str, image: str) -> str:
    return (
        f"type: task\nname: {name}\nimage: {image}\ncommands: ['sleep 300']\n"
        f"stop_duration: 1s\n{RESOURCES}"
    )


def kill_agent(agent_dir: Path) -> None:
    pid = read_pid(DataDir(agent_dir))
    assert pid is not None and alive(pid)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + NET  # a safety net: SIGKILL is not refused
    while alive(pid):
        assert time.monotonic() < deadline, "the agent outlived SIGKILL"
        time.sleep(0.01)


def start_agent(agent_dir: Path, env: dict[str, str]) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "dstack_plan.agent", "start", "--data-dir", str(agent_dir)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr


def test_a_local_agent_killed_and_started_again_mid_job_is_tolerated(
    dstack: Dstack,
    tmp_path: Path,
    agent_dir: Path,
    cli_env: dict[str, str],
    docker_client: Any,
) -> None:
    project = tmp_path / "project"
    image = ensure_busybox_image(docker_client)
    (project / "box.dstack.yml").write_text(container_task("box", image))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.box", {"running"}, timeout=NET)
    job = state(project)["resources"]["task.box"]["attributes"]["jobs"][0]["id"]
    clock = FakeClock(time.time())
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    watcher = Watcher(watched)

    async def scenario() -> None:
        assert (await watcher.tick()).runs == {"task.box": "running"}
        serial = state(project)["serial"]
        kill_agent(agent_dir)
        # a tick while it is down concludes nothing: this machine's agent not answering fails
        # the tick (never the job), and the next tick asks again
        with pytest.raises(DstackPlanError, match="cannot reach the agent"):
            await watcher.tick()
        clock.advance(300)
        after = state(project)
        assert after["serial"] == serial, "a tick without the agent wrote state"
        assert after["resources"]["task.box"]["status"] == "running"

        start_agent(agent_dir, cli_env)  # on a new port: the long-lived watch finds it
        report = await watcher.tick()
        assert report.runs == {"task.box": "running"}
        assert [(j.job_id, j.status) for j in report.jobs] == [(job, "running")]

    asyncio.run(_closing(watched, scenario()))
    assert state(project)["resources"]["task.box"]["attributes"]["jobs"][0]["id"] == job
    assert dstack("destroy", "-y").returncode == 0


def test_the_next_tick_starts_a_killed_local_agent_again(
    dstack: Dstack,
    tmp_path: Path,
    agent_dir: Path,
    docker_client: Any,
) -> None:
    """Nobody restarts it: the tick after the failed one does (the container is re-adopted)."""
    project = tmp_path / "project"
    image = ensure_busybox_image(docker_client)
    (project / "box.dstack.yml").write_text(container_task("box", image))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.box", {"running"}, timeout=NET)
    job = state(project)["resources"]["task.box"]["attributes"]["jobs"][0]["id"]
    watched = Project(project, agent_dir=agent_dir, clock=FakeClock(time.time()))
    watcher = Watcher(watched)

    async def scenario() -> None:
        await watcher.tick()
        kill_agent(agent_dir)
        with pytest.raises(DstackPlanError):
            await watcher.tick()
        report = await watcher.tick()
        assert [(j.job_id, j.status) for j in report.jobs] == [(job, "running")]

    asyncio.run(_closing(watched, scenario()))
    pid = read_pid(DataDir(agent_dir))
    assert pid is not None and alive(pid)
    assert dstack("destroy", "-y").returncode == 0


async def _closing(project: Project, work: Any) -> None:
    try:
        await work
    finally:
        await project.close()


def start_watch(project: Path, env: dict[str, str], interval: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dstack_plan.cli", "watch", "--interval", interval],
        cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_watch_killed_mid_tick_and_started_again_loses_nothing_and_acts_at_once(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    # leases of an hour: a watch started after one was killed leads at once only because it
    # sees that one's process gone, never because its lease ran out
    cli_env[LEASE_ENV] = "1h"
    (project / "long.dstack.yml").write_text(task("long", "sleep 300"))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.long", {"running"}, timeout=NET)
    lineage, serial = state(project)["lineage"], state(project)["serial"]
    long_job = state(project)["resources"]["task.long"]["attributes"]["jobs"][0]["id"]

    # killed at different points of its 0.2 s tick cycle, again and again
    recorded = {"submitted", "running"}
    for delay in (0.05, 0.13, 0.21, 0.34, 0.47):
        watch = start_watch(project, cli_env, "0.2s")
        try:
            wait_until(lambda w=watch: lease_pid(project) == w.pid, NET, "watch never led")
            time.sleep(delay)  # the kill lands at another point of the tick cycle each time
        finally:
            watch.send_signal(signal.SIGKILL)
            watch.wait(NET)
        now = state(project)  # readable, same history, never going back
        assert now["lineage"] == lineage and now["serial"] >= serial
        serial = now["serial"]
        long_entry = now["resources"]["task.long"]
        # apply recorded "submitted"; a watch killed before its first commit leaves that,
        # and once a tick recorded "running" no kill brings it back
        assert long_entry["status"] in recorded, (delay, long_entry["status"])
        if long_entry["status"] == "running":
            recorded = {"running"}
        assert long_entry["attributes"]["jobs"][0]["id"] == long_job
    events = dstack("events", "--json")
    assert events.returncode == 0, events.stderr
    assert all(json.loads(line) for line in events.stdout.splitlines())

    # a job fails while no watch runs; the one started again retries it in its first tick:
    # one tick is all `--once` runs, and only a leader acts (the lease of the watch killed
    # last, an hour long, is not waited out: its process is gone)
    marker = tmp_path / "failed-once"
    policy = "retry: {on_events: [error], duration: 1m}\n"
    (project / "flaky.dstack.yml").write_text(flaky(marker, policy))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.flaky", {"failed"}, timeout=NET)
    assert "retry" not in state(project)["resources"]["task.flaky"]["attributes"]
    once = dstack("watch", "--once", timeout=NET)
    assert once.returncode == 0, once.stdout + once.stderr
    assert "retry" in state(project)["resources"]["task.flaky"]["attributes"]
    assert state(project)["resources"]["task.long"]["status"] == "running"
    assert alive_job(project, long_job)
    assert dstack("destroy", "-y").returncode == 0


def alive_job(project: Path, job_id: str) -> bool:
    entry = state(project)["resources"]["task.long"]
    return entry["status"] == "running" and entry["attributes"]["jobs"][0]["id"] == job_id
