"""`dstack watch` enforces utilization_policy and inactivity_duration on the local fleet, with
a real agent (fake GPUs: a fake nvidia-smi first on its PATH, reading their utilisation from a
file) and watch on a fake clock, ticked by hand."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.client import AgentClient
from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import CLI, Dstack, fake_nvidia_smi, gpu_cli
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES

FAKE_NVIDIA_SMI = """#!/bin/sh
# Two fake GPUs; their utilisation is lines 1 and 2 of the file `util` beside this script.
util="$(dirname "$0")/util"
case "$*" in
  *memory.total,uuid*)
    echo "0, NVIDIA Fake A100, 81920, GPU-fake-0"
    echo "1, NVIDIA Fake A100, 81920, GPU-fake-1" ;;
  *utilization.gpu*)
    echo "0, $(sed -n 1p "$util"), 1024, 81920"
    echo "1, $(sed -n 2p "$util"), 1024, 81920" ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""

MINUTE = 60.0


@pytest.fixture
def gpu_bin(tmp_path: Path) -> Path:
    directory = fake_nvidia_smi(tmp_path / "fake-bin", FAKE_NVIDIA_SMI)
    (directory / "util").write_text("0\n0\n")
    return directory


@pytest.fixture
def gpu_dstack(cli_env: dict[str, str], tmp_path: Path, gpu_bin: Path) -> Dstack:
    """`dstack` whose agent (started by the first apply) sees the two fake GPUs."""
    return gpu_cli(cli_env, tmp_path / "project", gpu_bin)


def only_job(project: Path, address: str) -> str:
    jobs = state(project)["resources"][address]["attributes"]["jobs"]
    assert len(jobs) == 1, jobs
    return str(jobs[0]["id"])


async def job_info(agent_dir: Path, job_id: str, ended: bool = False) -> JobInfo:
    """The job as its agent reports it; with `ended`, once it has ended (stop_duration 1s)."""
    client = AgentClient.from_data_dir(agent_dir)
    return await client.wait(job_id, timeout=15) if ended else await client.get_job(job_id)


Step = Callable[[], object]


async def ticks(watcher: Watcher, clock: FakeClock, steps: list[tuple[float, Step]]) -> None:
    """Advance `clock` by each step's seconds, tick, then run its check."""
    try:
        for seconds, check in steps:
            clock.advance(seconds)
            await watcher.tick()
            result = check()
            if asyncio.iscoroutine(result):
                await result
    finally:
        await watcher.project.close()


def watcher_for(project: Path, agent_dir: Path) -> tuple[Watcher, FakeClock]:
    # the agent stamps jobs with the real time: watch's clock starts there and runs ahead
    clock = FakeClock(time.time())
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    return Watcher(watched, events=EventLog(watched.backend)), clock


AGENT_STOP_REASONS = ("terminated_due_to_utilization_policy", "inactivity_duration_exceeded")


def limit_events(dstack: Dstack, address: str) -> list[dict]:
    out = dstack("events", "--json")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    # the stop watch made for a limit, not the status change the next tick saw (whose
    # reason is the agent's termination reason)
    return [
        e
        for e in events
        if e["address"] == address
        and e["kind"] == "job"
        and e["reason"]
        and not e["reason"].startswith(AGENT_STOP_REASONS)
    ]


@pytest.mark.parametrize("busy_gpu", [False, True])
def test_a_job_whose_gpus_all_idle_for_the_window_is_stopped_and_not_retried(
    gpu_dstack: Dstack, tmp_path: Path, agent_dir: Path, gpu_bin: Path, busy_gpu: bool
) -> None:
    project = tmp_path / "project"
    (gpu_bin / "util").write_text("3\n95\n" if busy_gpu else "3\n9\n")
    (project / "train.dstack.yml").write_text(
        "type: task\nname: train\ncommands: ['exec sleep 300']\nstop_duration: 1s\n"
        "retry: true\nutilization_policy: {min_gpu_utilization: 10, time_window: 5m}\n"
        "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: 2}\n"
    )
    assert gpu_dstack("apply", "-y").returncode == 0
    wait_for_status(gpu_dstack, "task.train", {"running"})
    job_id = only_job(project, "task.train")
    watcher, clock = watcher_for(project, agent_dir)

    async def running() -> None:
        assert (await job_info(agent_dir, job_id)).status.value == "running"

    async def stopped() -> None:
        info = await job_info(agent_dir, job_id, ended=True)
        assert info.status.value == "terminated"
        assert info.termination_reason is not None
        assert info.termination_reason.value == "terminated_due_to_utilization_policy"

    def not_retried() -> None:
        assert only_job(project, "task.train") == job_id
        assert state(project)["resources"]["task.train"]["status"] == "terminated"

    # readings at +0, +2.5m, +4m59s: not yet a whole window; at +5m it is (unless one is busy)
    steps: list[tuple[float, Step]] = [(0, running), (150, running), (149, running)]
    if busy_gpu:
        steps += [(1, running), (10 * MINUTE, running)]
    else:
        steps += [(1, stopped), (5, not_retried), (60, not_retried)]
    asyncio.run(ticks(watcher, clock, steps))
    found = limit_events(gpu_dstack, "task.train")
    if busy_gpu:
        assert found == []
    else:
        assert [(e["job_id"], e["old_status"]) for e in found] == [(job_id, "running")]
        assert "all 2 GPUs (0, 1) utilization below 10%" in found[0]["reason"]
    assert gpu_dstack("destroy", "-y").returncode == 0


DEV = f"type: dev-environment\nname: dev\ninactivity_duration: 10m\nstop_duration: 1s\n{RESOURCES}"


@pytest.mark.parametrize("touched", [False, True])
def test_a_dev_environment_without_activity_is_stopped_and_a_touch_keeps_it(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, touched: bool
) -> None:
    project = tmp_path / "project"
    (project / "dev.dstack.yml").write_text(DEV)
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "dev-environment.dev", {"running"})
    job_id = only_job(project, "dev-environment.dev")
    watcher, clock = watcher_for(project, agent_dir)

    async def running() -> None:
        assert (await job_info(agent_dir, job_id)).status.value == "running"

    async def touch() -> None:
        await running()
        await AgentClient.from_data_dir(agent_dir).touch(job_id)

    async def stopped() -> None:
        info = await job_info(agent_dir, job_id, ended=True)
        assert info.status.value == "terminated"
        assert info.termination_reason is not None
        assert info.termination_reason.value == "inactivity_duration_exceeded"

    steps: list[tuple[float, Step]] = [(0, running), (9 * MINUTE, touch if touched else running)]
    if touched:
        # the touch is seen by the next tick (+9m): idle from then, so kept at +19m exactly
        steps += [(0, running), (2 * MINUTE, running), (8 * MINUTE, running), (1, stopped)]
    else:
        steps += [(2 * MINUTE, stopped)]
    asyncio.run(ticks(watcher, clock, steps))
    found = limit_events(dstack, "dev-environment.dev")
    assert [e["job_id"] for e in found] == [job_id]
    assert "over inactivity_duration of 600s" in found[0]["reason"]
    assert dstack("destroy", "-y").returncode == 0


def test_attach_records_activity(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "dev.dstack.yml").write_text(DEV)
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "dev-environment.dev", {"running"})
    job_id = only_job(project, "dev-environment.dev")
    started = asyncio.run(job_info(agent_dir, job_id)).last_activity_at
    assert started is not None

    attach = subprocess.Popen(
        [*CLI, "attach", "dev", "--no-logs"], cwd=project, env=cli_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while asyncio.run(job_info(agent_dir, job_id)).last_activity_at == started:
            assert attach.poll() is None, attach.communicate()
            assert time.monotonic() < deadline, "attach never touched the job"
            time.sleep(0.1)
    finally:
        attach.send_signal(signal.SIGINT)
        attach.wait(15)
    assert dstack("destroy", "-y").returncode == 0
