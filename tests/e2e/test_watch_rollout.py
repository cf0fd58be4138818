"""Services under apply and watch with a real local agent and Docker: a rolling update
replaces the replicas one at a time (new before old), an apply killed midway is finished by
watch, and a replica killed outside the tool is restarted alone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.project import Project
from dstack_plan.runs.rollout import in_progress, job_spec_hash
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.infra.http_probe import fetch

pytestmark = pytest.mark.docker


def service(image: str, log: Path, version: int, delay: int = 0, extra: str = "") -> str:
    """Two replicas serving `v<version>`; each notes its start and its SIGTERM in `log`."""
    script = (
        "mkdir -p /www; echo v$VERSION > /www/index.html; "
        "echo start $VERSION $DSTACK_REPLICA_NUM >> /log/events; "
        "trap 'echo stop $VERSION $DSTACK_REPLICA_NUM >> /log/events; exit 0' TERM; "
        f"sleep {delay}; httpd -f -p 8799 -h /www & wait"
    )
    return (
        f"type: service\nname: web\nimage: {image}\nport: 8799\nreplicas: 2\n"
        f"stop_duration: 2s\nenv: {{VERSION: '{version}'}}\nvolumes: ['{log}:/log']\n"
        f"commands: [{json.dumps(script)}]\n{extra}{RESOURCES}"
    )


def events(log: Path) -> list[str]:
    path = log / "events"
    return path.read_text().splitlines() if path.exists() else []


def assert_rolled(lines: list[str], old: int, new: int) -> None:
    """Each replica's new job started before its old one was stopped, and two replicas ran
    all along."""
    for replica in (0, 1):
        started = lines.index(f"start {new} {replica}")
        stopped = lines.index(f"stop {old} {replica}")
        assert started < stopped, lines
    running = 0
    for n, line in enumerate(lines):
        running += 1 if line.startswith("start") else -1
        if n >= 1:
            assert running >= 2, lines


def entry(project: Path) -> dict[str, Any]:
    return state(project)["resources"]["service.web"]


def active_hashes(project: Path) -> list[tuple[int, str | None]]:
    jobs = entry(project)["attributes"]["jobs"]
    return sorted((j["replica"], j.get("spec_hash")) for j in jobs)


@pytest.fixture
def image(docker_client: Any) -> str:
    from tests.infra.docker_images import ensure_busybox_image

    return ensure_busybox_image(docker_client)


def start_v1(dstack: Dstack, tmp_path: Path, image: str, extra: str = "") -> tuple[Path, Path]:
    project = tmp_path / "project"
    log = tmp_path / "log"
    log.mkdir()
    (project / "web.dstack.yml").write_text(service(image, log, 1, extra=extra))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    row = wait_for_status(dstack, "service.web", {"running"})
    assert [j["status"] for j in row["jobs"]] == ["running", "running"]
    return project, log


def test_a_changed_env_rolls_the_replicas_one_at_a_time(
    dstack: Dstack, tmp_path: Path, image: str
) -> None:
    project, log = start_v1(dstack, tmp_path, image)
    (project / "web.dstack.yml").write_text(service(image, log, 2))

    planned = dstack("plan")
    assert planned.returncode == 0, planned.stderr
    assert "will be updated in-place, rolling: one replica at a time" in planned.stdout
    assert "Plan: 0 to add, 1 to change, 0 to destroy." in planned.stdout
    as_json = json.loads(dstack("plan", "--json").stdout)
    (change,) = [c for c in as_json["resource_changes"] if c["address"] == "service.web"]
    assert change["change"]["actions"] == ["update"]
    assert change["action_reason"] == "update_rolling"

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    target = job_spec_hash(entry(project)["spec"])
    assert active_hashes(project) == [(0, target), (1, target)]
    ports = [j["ports"][0]["host_port"] for j in entry(project)["attributes"]["jobs"]]
    assert [fetch(p) for p in ports] == ["v2", "v2"]
    assert "rollout" not in entry(project)["attributes"]
    assert_rolled(events(log), 1, 2)
    assert dstack("plan", "--detailed-exitcode").returncode == 0
    assert dstack("destroy", "-y").returncode == 0


async def _ticks_until_rolled(project: Path, agent_dir: Path, timeout: float = 60) -> int:
    watcher = Watcher(Project(project, agent_dir=agent_dir))
    ticks = 0
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await watcher.tick()
            ticks += 1
            stored = ResourceState.model_validate(entry(project))
            if not in_progress(stored):
                return ticks
            await asyncio.sleep(0.3)
        raise AssertionError(f"rollout not finished: {entry(project)['attributes']}")
    finally:
        await watcher.project.close()


def test_an_apply_killed_mid_rollout_is_finished_by_watch(
    dstack: Dstack, tmp_path: Path, image: str, agent_dir: Path, cli_env: dict[str, str]
) -> None:
    project, log = start_v1(dstack, tmp_path, image)
    # the new replicas answer only after 4 s: apply is still waiting for the first one
    (project / "web.dstack.yml").write_text(service(image, log, 2, delay=4))
    apply = subprocess.Popen(
        [*CLI, "apply", "-y"],
        cwd=project,
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            attributes = entry(project)["attributes"]
            if "rollout" in attributes and len(attributes["jobs"]) == 3:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"no rollout started: {entry(project)}")
    finally:
        os.kill(apply.pid, signal.SIGKILL)
        apply.wait()
    assert in_progress(ResourceState.model_validate(entry(project)))
    listed = dstack("ps", "--json")
    (row,) = json.loads(listed.stdout)
    assert any(n.startswith("rolling out: 0/2 replicas") for n in row["notes"]), row["notes"]
    replanned = dstack("plan", "--detailed-exitcode")  # apply could finish it too
    assert replanned.returncode == 2, replanned.stdout + replanned.stderr
    assert "finishing one left unfinished" in json.dumps(
        json.loads(dstack("plan", "--json").stdout)
    )

    ticks = asyncio.run(_ticks_until_rolled(project, agent_dir))
    assert ticks > 1  # one step per tick
    target = job_spec_hash(entry(project)["spec"])
    assert active_hashes(project) == [(0, target), (1, target)]
    assert "rollout" not in entry(project)["attributes"]
    assert_rolled(events(log), 1, 2)
    ports = [j["ports"][0]["host_port"] for j in entry(project)["attributes"]["jobs"]]
    assert [fetch(p) for p in ports] == ["v2", "v2"]
    assert dstack("plan", "--detailed-exitcode").returncode == 0
    assert dstack("destroy", "-y").returncode == 0


def test_a_replica_killed_outside_the_tool_is_restarted_alone(
    dstack: Dstack, tmp_path: Path, image: str, agent_dir: Path, docker_client: Any
) -> None:
    project, _ = start_v1(dstack, tmp_path, image, extra="retry: {on_events: [error]}\n")
    rows = json.loads(dstack("ps", "--json").stdout)[0]["jobs"]
    started = {j["replica"]: j["started_at"] for j in rows}
    ids = {j["replica"]: j["id"] for j in rows}
    (killed,) = docker_client.containers.list(filters={"label": f"dstack-plan.job-id={ids[1]}"})
    killed.kill()
    deadline = time.monotonic() + 30
    while json.loads(dstack("ps", "--json").stdout)[0]["status"] != "failed":
        assert time.monotonic() < deadline
        time.sleep(0.2)

    async def tick() -> None:
        watcher = Watcher(Project(project, agent_dir=agent_dir))
        try:
            await watcher.tick()
        finally:
            await watcher.project.close()

    asyncio.run(tick())
    row = wait_for_status(dstack, "service.web", {"running"})
    assert [(j["replica"], j["status"]) for j in row["jobs"]] == [(0, "running"), (1, "running")]
    now = {j["replica"]: j["started_at"] for j in row["jobs"]}
    assert now[0] == started[0]  # replica 0 kept serving all along
    assert now[1] > started[1]  # replica 1 was started again
    assert entry(project)["attributes"]["retry"]["last_reason"] == "container_exited_with_error"
    # the killed replica's job is its first attempt, kept with its log; the new one has an id
    # of its own (`runs/attempts.py`)
    [attempt] = entry(project)["attributes"]["attempts"]
    assert (attempt["attempt"], attempt["status"]) == (1, "failed")
    assert [j["id"] for j in attempt["jobs"]] == [ids[1]]
    new = {j["replica"]: j["id"] for j in row["jobs"]}
    assert new[0] == ids[0] and new[1] != ids[1]
    assert [(a["attempt"], a["jobs"][0]["id"]) for a in row["attempts"]] == [
        (1, ids[1]),
        (2, ids[0]),
    ]
    assert dstack("logs", "web", "--replica", "1", "--attempt", "1").returncode == 0
    assert dstack("destroy", "-y").returncode == 0
    assert asyncio.run(web_jobs(agent_dir)) == []  # every attempt's job removed


async def web_jobs(agent_dir: Path) -> list[str]:
    from dstack_plan.agent.client import AgentClient

    async with AgentClient.from_data_dir(agent_dir) as client:
        return [j.id for j in await client.list_jobs(run_name="web")]
