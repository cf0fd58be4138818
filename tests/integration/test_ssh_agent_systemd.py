"""The agent as a systemd unit where systemd runs, detached (and said so) where it does not.

No systemd runs in the test network: the `sysd` host (tests/infra/ssh_hosts.py) has a fake
`systemctl` first on its login PATH that records its arguments and runs the unit's ExecStart
the way `Type=forking` does (only the unit's Environment=), and a stand-in for `/` that its
sshd points `DSTACK_PLAN_SYSTEMD_ROOT` at. Every other host has no systemd.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dstack_plan.providers.ssh.install import AgentBundle, build_bundle, find_agent
from dstack_plan.providers.ssh.systemd import unit_name
from tests.infra.ssh_hosts import SSHTestHosts
from tests.integration.test_ssh_agent import OFFER, provider

pytestmark = pytest.mark.ssh

UNIT = unit_name("sysd")


@pytest.fixture(scope="module")
def bundle(agent_bundle: AgentBundle) -> AgentBundle:
    return agent_bundle  # the session's (tests/integration/conftest.py)


def calls(hosts: SSHTestHosts) -> list[list[str]]:
    """What the fake systemctl was asked, in order."""
    log = hosts.systemd_root / "systemctl.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line) for line in lines]


def running(pid: int) -> bool:
    """The process runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def gone(pid: int) -> bool:
    """The process exits within a moment (the agent removes its pid file, which ends its unit,
    just before it exits)."""
    deadline = time.monotonic() + 5
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


async def test_a_host_with_systemd_gets_an_enabled_unit_running_the_agent(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    unit_file = ssh_hosts.systemd_root / "etc/systemd/system" / UNIT
    wants = ssh_hosts.systemd_root / "etc/systemd/system/multi-user.target.wants" / UNIT
    data = tmp_path / "remote/hosts/sysd/data"
    before = len(calls(ssh_hosts))
    first = provider(ssh_hosts, tmp_path, bundle, names=("sysd",))
    try:
        [instance] = await first.create_instances("onprem", OFFER, 1)
        assert first.problems == {}
        assert instance.status == "idle"
        installed = first.installed[instance.id]
        assert installed.persistent and installed.uploaded and not installed.already_running
    finally:
        await first.close()

    # the unit runs the agent's own `start` on its data dir, tracked by its pid file
    text = unit_file.read_text()
    assert f'"{tmp_path}/remote/hosts/sysd/agent.pyz" "start"' in text
    assert f'"--data-dir" "{data}"' in text and f"PIDFile={data}/agent.pid" in text
    assert wants.is_symlink()
    made = calls(ssh_hosts)[before:]
    assert ["daemon-reload"] in made and ["enable", "--now", "--quiet", UNIT] in made
    # the unit started the agent that answers (not a detached one): its pid is the unit's
    assert int((data / "agent.pid").read_text()) == installed.pid and running(installed.pid)
    environ = Path(f"/proc/{installed.pid}/environ").read_bytes().split(b"\0")
    assert f"PATH={ssh_hosts.systemd_bin}:/usr/bin:/bin".encode() in environ

    # the next command finds the unit's agent running: no new unit text, no reload
    before = len(calls(ssh_hosts))
    second = provider(ssh_hosts, tmp_path, bundle, names=("sysd",))
    try:
        [again] = await second.create_instances("onprem", OFFER, 1)
        reused = second.installed[again.id]
        assert reused.persistent and reused.already_running and not reused.uploaded
        assert reused.pid == installed.pid
        # its unit file current and enabled: reused without asking systemctl anything
        assert [c[0] for c in calls(ssh_hosts)[before:]] == []
        conn = await second.pool.connect(second.fleets["onprem"][0])
        found = await find_agent(conn, "sysd", agent_dir=second.agent_dir)
        assert found is not None and found.persistent and found.pid == installed.pid

        # destroying the fleet disables and stops the unit and removes its file; twice is fine
        await second.terminate([again])
        assert not unit_file.exists() and not wants.is_symlink()
        assert gone(installed.pid)
        assert ["disable", "--now", "--quiet", UNIT] in calls(ssh_hosts)[before:]
        await second.terminate([again])
    finally:
        await second.close()


async def test_a_changed_unit_replaces_the_agent_it_ran(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    """Another agent dir on the same host (another project): the unit now runs that one."""
    old = provider(ssh_hosts, tmp_path / "old", bundle, names=("sysd",))
    new = provider(ssh_hosts, tmp_path / "new", bundle, names=("sysd",))
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    try:
        [instance] = await old.create_instances("onprem", OFFER, 1)
        first = old.installed[instance.id]
        [instance] = await new.create_instances("onprem", OFFER, 1)
        second = new.installed[instance.id]
        assert second.persistent and not second.already_running
        assert gone(first.pid) and running(second.pid)
        assert second.directory == f"{tmp_path}/new/remote/hosts/sysd"
    finally:
        await new.terminate([instance])
        await old.close()
        await new.close()


async def test_a_host_without_systemd_runs_the_agent_detached_not_persistent(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    ssh = provider(ssh_hosts, tmp_path, bundle, names=("h1",))
    try:
        [instance] = await ssh.create_instances("onprem", OFFER, 1)
        installed = ssh.installed[instance.id]
        assert not installed.persistent and not installed.already_running
        await ssh.terminate([instance])
    finally:
        await ssh.close()


async def test_a_new_build_is_started_by_the_unit_after_systemd_stopped_the_old(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    old = provider(ssh_hosts, tmp_path, bundle, names=("sysd",))
    try:
        [instance] = await old.create_instances("onprem", OFFER, 1)
        before = old.installed[instance.id]
    finally:
        await old.close()
    newer = build_bundle(tmp_path / "newer.pyz", include_docker=False)
    logged = len(calls(ssh_hosts))
    new = provider(ssh_hosts, tmp_path, newer, names=("sysd",))
    try:
        [instance] = await new.create_instances("onprem", OFFER, 1)
        after = new.installed[instance.id]
        assert after.uploaded and after.persistent and not after.already_running
        assert gone(before.pid) and running(after.pid)
        # stopped through systemd (so Restart= cannot bring the old build back), then started
        made = calls(ssh_hosts)[logged:]
        assert made.index(["stop", UNIT]) < made.index(["enable", "--now", "--quiet", UNIT])
        data = Path(after.directory) / "data"
        assert int((data / "agent.pid").read_text()) == after.pid
    finally:
        await new.terminate([instance])
        await new.close()
