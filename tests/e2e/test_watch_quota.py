"""`dstack watch` enforces a namespace's daily GPU-hours on the local fleet, with a real agent
seeing four fake GPUs and watch on a fake clock, ticked by hand: once the namespace has used
its GPU-hours, its GPU jobs are stopped (`terminated_by_server`, not retried) with the reason
in the run's state and an event; its jobs without GPUs and other namespaces' jobs run on; a
queued run of the namespace stays queued with the quota as its reason; a user over their own
limit is stopped while another user of the namespace runs on."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack, fake_nvidia_smi, gpu_cli
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_watch_limits import Step, job_info, only_job, ticks

FOUR_GPUS = """#!/bin/sh
case "$*" in
  *memory.total,uuid*)
    for i in 0 1 2 3; do echo "$i, NVIDIA Fake A100, 81920, GPU-fake-$i"; done ;;
  *utilization.gpu*)
    for i in 0 1 2 3; do echo "$i, 50, 1024, 81920"; done ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""
QUOTAS = "namespaces:\n  dev: {gpu_hours_per_day: 0.0001}\n"
"""0.36 GPU-seconds a day: less than the 3-GPU job runs for real before watch stops it (the
agent's times count once it ended), far less than what it runs on watch's fake clock."""
LIMIT = "namespace dev: gpu_hours_per_day limit "


def task(name: str, gpus: int, namespace: str, extra: str = "") -> str:
    return (
        f"type: task\nname: {name}\nnamespace: {namespace}\ncommands: ['exec sleep 300']\n"
        f"stop_duration: 1s\n{extra}"
        f"resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: {gpus}}}\n"
    )


@pytest.fixture
def four_gpu_dstack(cli_env: dict[str, str], tmp_path: Path) -> Dstack:
    bin_dir = fake_nvidia_smi(tmp_path / "fake-bin", FOUR_GPUS)
    return gpu_cli(cli_env, tmp_path / "project", bin_dir, DSTACK_PLAN_USER="alice")


def behind(project: Path, agent_dir: Path) -> tuple[Watcher, FakeClock]:
    """A watcher whose clock starts a minute behind the agent's: at +0 the jobs have not
    started as it counts, so nothing is used yet."""
    clock = FakeClock(time.time() - 60)
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    return Watcher(watched, events=EventLog(watched.backend)), clock


def quota_stops(dstack: Dstack) -> list[dict]:
    out = dstack("events", "--json")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    return [e for e in events if (e["reason"] or "").startswith("quota_exceeded") and e["job_id"]]


def test_watch_stops_a_namespace_gpu_jobs_once_its_daily_gpu_hours_are_used(
    four_gpu_dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    dstack = four_gpu_dstack
    project = tmp_path / "project"
    (project / ".dstack").mkdir()
    (project / ".dstack" / "quotas.yml").write_text(QUOTAS)
    (project / "train.dstack.yml").write_text(task("train", 3, "dev", "retry: true\n"))
    (project / "notes.dstack.yml").write_text(task("notes", 0, "dev"))
    (project / "serve.dstack.yml").write_text(task("serve", 1, "prod"))
    # placed last (configuration order), when the others hold every GPU: queued
    retry = "retry: {on_events: [no-capacity], duration: 1h}\n"
    (project / "waiter.dstack.yml").write_text(task("waiter", 1, "dev", retry))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for address in ("task.train", "task.notes", "task.serve"):
        wait_for_status(dstack, address, {"running"})
    waiter = state(project)["resources"]["task.waiter"]["attributes"]
    assert "queued" in waiter and waiter["user"] == "alice"
    train, notes, serve = (only_job(project, f"task.{n}") for n in ("train", "notes", "serve"))
    watcher, clock = behind(project, agent_dir)

    async def running(*job_ids: str) -> None:
        for job_id in job_ids:
            assert (await job_info(agent_dir, job_id)).status.value == "running", job_id

    async def all_running() -> None:
        await running(train, notes, serve)

    async def train_stopped() -> None:
        info = await job_info(agent_dir, train, ended=True)
        assert info.status.value == "terminated"
        assert info.termination_reason is not None
        assert info.termination_reason.value == "terminated_by_server"
        await running(notes, serve)

    def recorded() -> None:
        entry = state(project)["resources"]["task.train"]
        assert entry["status"] == "terminated"
        assert only_job(project, "task.train") == train  # not retried
        reason = entry["attributes"]["termination_reason"]
        assert reason.startswith(f"quota_exceeded: {LIMIT}"), reason
        waiter = state(project)["resources"]["task.waiter"]
        assert waiter["status"] == "pending" and waiter["attributes"]["jobs"] == []
        why = waiter["attributes"]["queued"]["why"]
        assert f"over quota: {LIMIT}" in why, why

    # none used at +0; 3 x 60 GPU-seconds at +120: over the 0.36 allowed
    steps: list[tuple[float, Step]] = [
        (0, all_running), (120, train_stopped), (5, recorded), (120, recorded)
    ]  # fmt: skip
    asyncio.run(ticks(watcher, clock, steps))
    assert asyncio.run(job_info(agent_dir, serve)).status.value == "running"

    stops = quota_stops(dstack)
    assert [(e["address"], e["job_id"]) for e in stops] == [("task.train", train)]
    reason = stops[0]["reason"]
    assert reason.startswith(f"quota_exceeded: {LIMIT}") and "used today" in reason, reason
    assert reason.endswith("(run of user alice)")
    assert dstack("destroy", "-y").returncode == 0


def test_a_user_over_their_daily_limit_is_stopped_and_other_users_run_on(
    four_gpu_dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    dstack = four_gpu_dstack
    project = tmp_path / "project"
    (project / ".dstack").mkdir()
    (project / ".dstack" / "quotas.yml").write_text(
        "namespaces:\n  dev:\n    per_user: {gpu_hours_per_day: 0.0001}\n"
        "    users:\n      bob: {gpu_hours_per_day: 10}\n"
    )
    (project / "mine.dstack.yml").write_text(task("mine", 2, "dev"))
    assert dstack("apply", "-y", user="alice").returncode == 0
    (project / "his.dstack.yml").write_text(task("his", 1, "dev"))
    assert dstack("apply", "-y", user="bob").returncode == 0  # alice's run is kept as it is
    for address in ("task.mine", "task.his"):
        wait_for_status(dstack, address, {"running"})
    mine, his = only_job(project, "task.mine"), only_job(project, "task.his")
    resources = state(project)["resources"]
    assert resources["task.mine"]["attributes"]["user"] == "alice"
    assert resources["task.his"]["attributes"]["user"] == "bob"
    watcher, clock = behind(project, agent_dir)

    async def both_running() -> None:
        for job_id in (mine, his):
            assert (await job_info(agent_dir, job_id)).status.value == "running"

    async def only_alice_stopped() -> None:
        assert (await job_info(agent_dir, mine, ended=True)).status.value == "terminated"
        assert (await job_info(agent_dir, his)).status.value == "running"

    steps: list[tuple[float, Step]] = [(0, both_running), (120, only_alice_stopped)]
    asyncio.run(ticks(watcher, clock, steps))
    stops = quota_stops(dstack)
    assert [e["job_id"] for e in stops] == [mine]
    assert stops[0]["reason"].startswith(
        "quota_exceeded: namespace dev, user alice: gpu_hours_per_day limit "
    )
    assert dstack("destroy", "-y").returncode == 0
