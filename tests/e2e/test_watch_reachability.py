"""Hosts that stop answering, with real agents on SSH hosts (network namespaces) and watch's
clock faked for the grace period: a host cut off is `unreachable` only at the third failed
check; after the grace period its job fails `instance_unreachable` and the run, retried on
interruption, is placed on the other host; the host back is reachable again and the job
given up there is stopped. What ends each check is asserted, not how long it takes (that, with
the product's own keepalive and timeouts: benchmarks/ssh_host_faults.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import AgentError
from dstack_plan.project import Project
from dstack_plan.providers.ssh import connect as ssh_connect
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from dstack_plan.watch.reachability import GRACE_S
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.e2e.test_ssh_runs import task
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh

RETRY = "retry: {on_events: [interruption], duration: 1h}\n"
DOWN_CONNECT_TIMEOUT = 2.0
"""The connect timeout while a host's link is down: waited out on purpose, so short."""


def hosts_of(project: Path) -> dict[str, dict[str, Any]]:
    attributes = state(project)["resources"]["fleet.onprem"]["attributes"]
    return {h["name"]: h for h in attributes["hosts"]}


def job_of(project: Path) -> dict[str, Any]:
    return state(project)["resources"]["task.long"]["attributes"]["jobs"][0]


def test_a_host_cut_off_is_unreachable_after_three_checks_and_its_job_moves(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    agent_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = tmp_path / "project"
    write_fleet(project, ssh_hosts, "h1", "h2")
    (project / "long.dstack.yml").write_text(task("long", 1, ["sleep 300"], RETRY))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.long", {"running"}, timeout=60)
    first = job_of(project)
    lost = first["host"]
    name = next(n for n in ("h1", "h2") if ssh_hosts[n].address == lost)
    other = next(ssh_hosts[n].address for n in ("h1", "h2") if n != name)

    # the watch process talks to the hosts as the CLI does (same remote agent dir, no
    # known_hosts of root's)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DSTACK_PLAN_SSH_AGENT_DIR", str(remote))
    clock = FakeClock(time.time())
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    events = EventLog(watched.backend)
    watcher = Watcher(watched, events=events)

    async def scenario() -> None:
        report = await watcher.tick()
        assert report.fleets["onprem"] == {"busy": 1, "idle": 1}  # task.long runs on one
        ssh_hosts.cut_off(name)
        cut_at = clock.now()
        try:
            for check in (1, 2, 3):
                report = await watcher.tick()
                # told at once: the check failed on the refusal, not on a timeout
                (seen,) = [h for h in report.hosts if h.host == lost]
                assert not seen.reachable and "refused" in (seen.error or ""), seen
                host = hosts_of(project)[lost]
                assert host["failed_checks"] == check
                assert host["status"] == ("unreachable" if check == 3 else "idle"), host
                assert host["unreachable_since"] == pytest.approx(cut_at, abs=1)
                clock.advance(5)
            assert report.fleets["onprem"] == {"idle": 1, "unreachable": 1}
            listed = dstack("fleet", "list")
            assert f"{lost}" in listed.stdout and "unreachable since" in listed.stdout
            # within the grace period nothing is concluded: the job is still the same one
            assert job_of(project)["id"] == first["id"]
            assert state(project)["resources"]["task.long"]["status"] == "running"

            clock.advance(GRACE_S)
            await watcher.tick()
            entry = state(project)["resources"]["task.long"]
            assert entry["attributes"]["jobs"][0]["status"] == "failed"
            assert entry["attributes"]["retry"]["last_event"] == "interruption"
            assert entry["attributes"]["retry"]["last_reason"] == "instance_unreachable"
            assert hosts_of(project)[lost]["lost_jobs"] == [first["id"]]

            clock.advance(16)  # the first backoff step
            await watcher.tick()
            moved = job_of(project)
            assert moved["id"] != first["id"] and moved["host"] == other, moved
        finally:
            ssh_hosts.start(name)

        # it ran on unseen: back, the host answers (once the reconnect backoff is over) and
        # the job given up there is stopped
        clock.advance(60)
        fleet_state = watched.backend.read().state
        agent = await watched.machines.agent("onprem", lost, fleet_state)
        assert (await agent.get_job(first["id"])).status.value == "running"
        await watcher.tick()
        host = hosts_of(project)[lost]
        assert (host["status"], host["failed_checks"], host["lost_jobs"]) == ("idle", 0, [])
        with pytest.raises(AgentError) as gone:
            await agent.get_job(first["id"])
        assert gone.value.status == 404
        assert job_of(project)["id"] == moved["id"]  # the new job runs on

    try:
        asyncio.run(_closing(watched, scenario()))
    finally:
        ssh_hosts.start(name)
    changes = [(e.old_status, e.new_status) for e in events.read() if e.kind == "host"]
    assert changes == [("idle", "unreachable"), ("unreachable", "idle")]
    assert dstack("destroy", "-y").returncode == 0


def test_a_tick_is_not_held_up_by_a_host_whose_link_went_down(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    agent_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # packets lost, nothing refused: the kept connection must be found dead (keepalive),
    # and the host not dialled again on every request while it stays down. The keepalive
    # and the connect timeout are made short, to wait less; what the test asserts is which
    # of them ended each check, and how often the host was dialled.
    monkeypatch.setattr(ssh_connect, "KEEPALIVE_INTERVAL", 1.0)  # dead after 3 s of silence
    dials: list[str] = []
    create_connection = asyncssh.create_connection

    async def dial(*args: Any, **kwargs: Any) -> Any:
        dials.append(args[1])  # (client factory, host, port)
        return await create_connection(*args, **kwargs)

    monkeypatch.setattr(asyncssh, "create_connection", dial)
    project = tmp_path / "project"
    write_fleet(project, ssh_hosts, "h1", "h2")
    (project / "long.dstack.yml").write_text(task("long", 1, ["sleep 300"]))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.long", {"running"}, timeout=60)
    job = job_of(project)
    name = next(n for n in ("h1", "h2") if ssh_hosts[n].address == job["host"])
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DSTACK_PLAN_SSH_AGENT_DIR", str(remote))
    clock = FakeClock(time.time())
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    watcher = Watcher(watched)

    async def scenario() -> None:
        await watcher.tick()
        fleet = watched.backend.read().state.resources["fleet.onprem"]
        pool = watched.machines.kept_provider(fleet).pool
        assert dials.count(job["host"]) == 1  # one connection, kept
        connect_timeout, pool.connect_timeout = pool.connect_timeout, DOWN_CONNECT_TIMEOUT
        ssh_hosts.link(name, up=False)
        try:
            errors, dialled = [], []
            for _ in range(3):
                before = dials.count(job["host"])
                report = await watcher.tick()
                (seen,) = [h for h in report.hosts if h.host == job["host"]]
                assert not seen.reachable
                errors.append(seen.error)
                dialled.append(dials.count(job["host"]) - before)
                clock.advance(5)
            # the kept connection was found dead (keepalive), so the host was dialled again,
            # and each check ended on that dial failing (its connect timeout, or the network
            # saying the host is unreachable), never on a request left hanging
            host = job["host"]
            dial_failed = (
                f"{host}: no SSH answer from {host}:22 within {DOWN_CONNECT_TIMEOUT:g}s",
                f"{host}: {host}:22 is unreachable",
            )
            assert dialled[0] >= 1, (dialled, errors)
            assert all(e is not None and e.startswith(dial_failed) for e in errors), errors
            # not dialled again on every request while down: once at most in the next tick
            # (its backoff), and not at all in the one after (backoff of 10 s, 5 s later)
            assert dialled[1:] in ([1, 0], [0, 0]), dialled
            assert hosts_of(project)[job["host"]]["status"] == "unreachable"
        finally:
            pool.connect_timeout = connect_timeout
            ssh_hosts.link(name, up=True)
        for _ in range(4):  # the network may need a moment (neighbour discovery)
            clock.advance(60)  # past the reconnect backoff
            await watcher.tick()
            if hosts_of(project)[job["host"]]["status"] == "idle":
                break
        assert hosts_of(project)[job["host"]]["status"] == "idle"
        assert state(project)["resources"]["task.long"]["status"] == "running"
        assert job_of(project)["id"] == job["id"]  # it ran on: nothing was concluded

    try:
        asyncio.run(_closing(watched, scenario()))
    finally:
        ssh_hosts.link(name, up=True)
    assert dstack("destroy", "-y").returncode == 0


async def _closing(project: Project, work: Any) -> None:
    try:
        await work
    finally:
        await project.close()
