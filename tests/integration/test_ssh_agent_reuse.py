"""A host whose agent runs is reused in one remote command: no `agent.pyz start`, no python.

Real sshd hosts in network namespaces sharing this machine's file system (see
tests/integration/test_ssh_agent.py), so a test reads and changes the host's agent files
directly. The agent's `start` command opens (creating) `data/start.lock` and the agent's
`serve` never touches it: a removed `start.lock` that stays away shows no `start` ran.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dstack_plan.providers.ssh.install import SHA256_NAME, AgentBundle
from dstack_plan.providers.ssh.provider import SSHProvider
from tests.infra.ssh_hosts import SSHTestHosts
from tests.integration.test_ssh_agent import FLEET, OFFER, provider
from tests.integration.test_ssh_agent_systemd import gone

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def bundle(agent_bundle: AgentBundle) -> AgentBundle:
    return agent_bundle  # the session's (tests/integration/conftest.py)


def host_dir(tmp_path: Path, node: str) -> Path:
    return tmp_path / "remote" / "hosts" / node


async def install(ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle) -> SSHProvider:
    """A provider that has installed the agent on h1 (closed by the caller)."""
    ssh = provider(ssh_hosts, tmp_path, bundle, names=("h1",))
    instances = await ssh.create_instances(FLEET, OFFER, 1)
    assert ssh.problems == {} and [i.status for i in instances] == ["idle"]
    return ssh


async def reprovision(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> tuple[SSHProvider, str]:
    """A new provider (a later command) provisioning h1 again: it and the instance id."""
    ssh = provider(ssh_hosts, tmp_path, bundle, names=("h1",))
    [instance] = await ssh.create_instances(FLEET, OFFER, 1)
    assert ssh.problems == {} and instance.status == "idle"
    return ssh, instance.id


async def test_a_running_agent_is_reused_without_running_start(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    first = await install(ssh_hosts, tmp_path, bundle)
    [installed] = first.installed.values()
    await first.close()
    where = host_dir(tmp_path, "h1")
    assert (where / SHA256_NAME).read_text().strip() == bundle.sha256  # recorded at upload
    start_lock = where / "data" / "start.lock"
    start_lock.unlink()

    second, instance_id = await reprovision(ssh_hosts, tmp_path, bundle)
    try:
        reused = second.installed[instance_id]
        assert reused.already_running and not reused.uploaded
        assert reused.pid == installed.pid and reused.port == installed.port
        assert reused.token.get_secret_value() == installed.token.get_secret_value()
        assert not start_lock.exists()  # no `agent.pyz start` ran on the host
        client = await second.agent(second.host_instances(FLEET)[0])
        assert (await client.health()).status == "ok"
    finally:
        await second.terminate(second.host_instances(FLEET))
        await second.close()


async def test_the_recorded_sha256_decides_whether_the_host_has_this_build(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    """The sha256 file beside the bundle is what is compared (the bundle is not hashed on the
    host): another value in it means another build, which is replaced."""
    first = await install(ssh_hosts, tmp_path, bundle)
    [installed] = first.installed.values()
    await first.close()
    sha_file = host_dir(tmp_path, "h1") / SHA256_NAME
    sha_file.write_text("0" * 64 + "\n")

    second, instance_id = await reprovision(ssh_hosts, tmp_path, bundle)
    try:
        replaced = second.installed[instance_id]
        assert replaced.uploaded and not replaced.already_running
        assert replaced.pid != installed.pid
        assert sha_file.read_text().strip() == bundle.sha256
    finally:
        await second.terminate(second.host_instances(FLEET))
        await second.close()


async def test_a_bundle_without_a_recorded_sha256_is_hashed_once_and_reused(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    """A host installed before the sha256 file existed: same build, same agent, and the file
    is written for the next time."""
    first = await install(ssh_hosts, tmp_path, bundle)
    [installed] = first.installed.values()
    await first.close()
    sha_file = host_dir(tmp_path, "h1") / SHA256_NAME
    sha_file.unlink()

    second, instance_id = await reprovision(ssh_hosts, tmp_path, bundle)
    try:
        reused = second.installed[instance_id]
        assert reused.already_running and not reused.uploaded and reused.pid == installed.pid
        assert sha_file.read_text().strip() == bundle.sha256
    finally:
        await second.terminate(second.host_instances(FLEET))
        await second.close()


async def test_a_stale_pid_file_is_not_taken_for_a_running_agent(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    """The agent was SIGKILLed (its pid and connection files stay), and its pid now belongs
    to another process: a new agent is started, not the dead one's port reused."""
    first = await install(ssh_hosts, tmp_path, bundle)
    [installed] = first.installed.values()
    await first.close()
    data = host_dir(tmp_path, "h1") / "data"
    os.kill(installed.pid, 9)
    other = subprocess.Popen(["sleep", "60"])
    try:
        assert gone(installed.pid)
        assert (data / "agent.json").exists()  # left behind by the SIGKILL
        (data / "agent.pid").write_text(f"{other.pid}\n")
        second, instance_id = await reprovision(ssh_hosts, tmp_path, bundle)
        try:
            started = second.installed[instance_id]
            assert not started.already_running and not started.uploaded
            assert started.pid not in (installed.pid, other.pid)
            client = await second.agent(second.host_instances(FLEET)[0])
            assert (await client.health()).status == "ok"
        finally:
            await second.terminate(second.host_instances(FLEET))
            await second.close()
    finally:
        other.kill()
        other.wait()
