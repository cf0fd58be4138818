"""Borrow and reclaim on an exported fleet: platform exports its two one-GPU hosts to ml, each
project guaranteed one GPU. ml borrows platform's idle GPU (two jobs); platform submits; its
watch preempts ml's newest job, which gets SIGTERM and its grace to write a checkpoint; ml's
watch sends that run back to `pending` (preempted) and does not place it again while platform
waits for the GPU (no preemption loop); platform's run is placed; once it is done, ml's run
starts again and resumes from its checkpoint. Real sshd hosts with fake GPUs, both watches
in-process on fake clocks, ticked by hand; ml's state in S3 (moto), platform's a local file."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_fleet_exports import _projects_file, _rows
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import fleet_text, remote  # noqa: F401 - fixture
from tests.infra.moto_server import REGION, S3Bucket
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(600)]

WAIT = 90.0
"""Generous bound for what takes real time (a job starting, its SIGTERM, its log)."""
RESOURCES = "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: 1}\n"


def _ok(done) -> None:  # noqa: ANN001 - CompletedProcess
    assert done.returncode == 0, done.stdout + done.stderr


def _checkpointed(name: str, ckpt: Path) -> str:
    script = (
        f"trap 'echo 7 > {ckpt}; exit 0' TERM; "
        f"if [ -f {ckpt} ]; then echo resumed-from-$(cat {ckpt}); fi; "
        "echo ready; sleep 600 & wait"
    )
    return (
        f"type: task\nname: {name}\nfleets: [platform/gpu]\ncommands: [{json.dumps(script)}]\n"
        "stop_duration: 30s\nretry: {on_events: [interruption, no-capacity], duration: 1h}\n"
        f"{RESOURCES}"
    )


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {WAIT:g}s"
        await asyncio.sleep(0.2)


def test_a_project_under_its_guarantee_reclaims_borrowed_gpus_by_graceful_preemption(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    s3_bucket: S3Bucket,
) -> None:
    platform, ml = tmp_path / "platform", tmp_path / "ml"
    for directory in (platform, ml):
        (directory / ".dstack").mkdir(parents=True)
    # ml keeps its state in S3 (moto): platform's watch reads it there, never writes it
    bucket = s3_bucket
    ml_state = bucket.url("ml/state.json")
    cli_env.update(bucket.env)
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    (ml / ".dstack" / "backend.yml").write_text(
        f"backend: s3\nbucket: {bucket.name}\nkey: ml/state.json\nregion: {REGION}\n"
        f"endpoint_url: {bucket.endpoint_url}\n"
    )
    (platform / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "gpu", "gpu", "gpu2"))
    (platform / ".dstack" / "quotas.yml").write_text(
        "projects:\n  platform: {guarantee: 50%}\n  ml: {guarantee: 1}\n"
    )
    _ok(dstack("apply", "-y", cwd=platform))
    _ok(dstack("export", "create", "share", "--fleet", "gpu", "--importer",
               f"ml={ml_state}", cwd=platform))  # fmt: skip

    # ml borrows: one job within its guarantee, the newer one on platform's idle GPU
    _projects_file(ml, platform, ssh_hosts.client_key)
    ckpt = tmp_path / "ckpt"
    (ml / "first.dstack.yml").write_text(_checkpointed("first", tmp_path / "ckpt-a"))
    _ok(dstack("apply", "-y", cwd=ml))
    (ml / "second.dstack.yml").write_text(_checkpointed("second", ckpt))
    _ok(dstack("apply", "-y", cwd=ml))
    rows = _rows(dstack, ml)
    assert rows["task.first"]["status"] == rows["task.second"]["status"] == "running"

    # platform's run finds no room and waits for it
    (platform / "train.dstack.yml").write_text(
        "type: task\nname: train\nfleets: [gpu]\ncommands: ['sleep 600']\nstop_duration: 1s\n"
        f"retry: {{on_events: [no-capacity], duration: 1h}}\n{RESOURCES}"
    )
    planned = dstack("plan", "--json", cwd=platform)
    assert planned.returncode == 0, planned.stderr
    changes = json.loads(planned.stdout)["resource_changes"]
    [train] = [c["placement"] for c in changes if c["address"] == "task.train"]
    assert train["pending"] is True
    [victim] = train["preempts"]  # ml's newest job, as the owner's watch would choose
    assert victim.startswith("ml: task.second (second-0-0-")
    assert "estimated start: unknown: runs ahead have no max_duration" in train["note"]
    _ok(dstack("apply", "-y", cwd=platform))
    assert state(platform)["resources"]["task.train"]["status"] == "pending"

    for name in ("HOME", "DSTACK_PLAN_SSH_AGENT_DIR", "DSTACK_PLAN_AGENT_DIR"):
        monkeypatch.setenv(name, cli_env[name])
    asyncio.run(_scenario(dstack, platform, ml, ckpt))
    assert not (ml / ".dstack" / "state.json").exists()  # it was S3's all along


async def _scenario(dstack: Dstack, platform: Path, ml: Path, ckpt: Path) -> None:
    owner_clock, ml_clock = FakeClock(time.time()), FakeClock(time.time())
    owner = Project(platform, clock=owner_clock)
    importer = Project(ml, clock=ml_clock)
    owner_watch = Watcher(owner, events=EventLog(owner.backend))
    ml_watch = Watcher(importer, events=EventLog(importer.backend))
    try:
        # platform is under its guarantee with a run waiting: ml's newest job is preempted
        await owner_watch.tick()
        events = EventLog(owner.backend).read()
        [preempted] = [e for e in events if (e.reason or "").startswith("preempted:")]
        assert preempted.address == "task.second"
        assert "project platform is under its guarantee of 1 GPUs on fleet gpu" in (
            preempted.reason or ""
        )
        await _until(ckpt.exists, "ml's task.second wrote its checkpoint on SIGTERM")
        assert ckpt.read_text().strip() == "7"
        assert state(platform)["policy"]["waiting"] == {"gpu": {"platform": 1.0}}

        # ml's watch: task.second goes back to pending, and is not placed back while platform waits
        async def ml_sees(status: str) -> bool:
            ml_clock.advance(60)
            await ml_watch.tick()
            return state(ml)["resources"]["task.second"]["status"] == status

        deadline = time.monotonic() + WAIT
        while not await ml_sees("pending"):
            assert time.monotonic() < deadline, "task.second pending after its preemption"
            await asyncio.sleep(0.5)
        for _ in range(3):  # retried, it is held back by the fair share: never a loop
            assert await ml_sees("pending")
        held = json.dumps(state(ml)["resources"]["task.second"]["attributes"])
        assert "platform is 1 GPUs under its guarantee and waits for 1 of them" in held

        # platform's run takes the GPU ml gave back
        deadline = time.monotonic() + WAIT
        while state(platform)["resources"]["task.train"]["status"] != "running":
            assert time.monotonic() < deadline, "platform's task.train placed"
            owner_clock.advance(60)
            await owner_watch.tick()
            await asyncio.sleep(0.5)

        # platform's run is done: nobody waits, ml borrows again and resumes its checkpoint
        _ok(dstack("stop", "-y", "task.train", cwd=platform))
        owner_clock.advance(60)
        await owner_watch.tick()
        assert "waiting" not in state(platform)["policy"]
        deadline = time.monotonic() + WAIT
        while not await ml_sees("running"):
            assert time.monotonic() < deadline, "ml's task.second placed again"
            await asyncio.sleep(0.5)
        await _until(
            lambda: "resumed-from-7" in dstack("logs", "second", cwd=ml).stdout,
            "task.second resumed from its checkpoint",
        )
        assert _rows(dstack, ml)["task.first"]["status"] == "running"  # never preempted
    finally:
        await owner.close()
        await importer.close()
    _ok(dstack("destroy", "-y", cwd=ml))
    _ok(dstack("destroy", "-y", cwd=platform))
