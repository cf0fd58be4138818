"""A host's agent that runs but does not answer is restarted by the next install, not reused.

Real sshd hosts in network namespaces sharing this machine's file system and process table
(tests/infra/ssh_hosts.py), so a test signals the host's agent by its pid, or starts one for the
host's data dir in this machine's own network namespace, where the host's 127.0.0.1 is not it.
No test waits on a duration: each waits for a condition, with a generous limit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dstack_plan.agent.protocol import HEALTH_TIMEOUT
from dstack_plan.providers.ssh.install import AgentBundle, RemoteAgent
from dstack_plan.providers.ssh.provider import SSHProvider
from tests.infra.ssh_hosts import SSHTestHosts
from tests.integration.test_agent_zipapp import system_python
from tests.integration.test_ssh_agent import FLEET, OFFER, provider
from tests.integration.test_ssh_agent_systemd import UNIT, calls, running

pytestmark = pytest.mark.ssh

PATIENCE = 60.0
"""Seconds any condition gets (the machine may be loaded); never a duration asserted."""


@pytest.fixture(scope="module")
def bundle(agent_bundle: AgentBundle) -> AgentBundle:
    return agent_bundle  # the session's (tests/integration/conftest.py)


def wait_until(condition: object, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {PATIENCE:g}s"
        time.sleep(0.05)


async def provision(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle, node: str
) -> tuple[SSHProvider, RemoteAgent]:
    """A provider (a command) provisioning `node`: it and the agent its install left there
    (the caller closes the provider)."""
    ssh = provider(ssh_hosts, tmp_path, bundle, names=(node,))
    [instance] = await ssh.create_instances(FLEET, OFFER, 1)
    assert ssh.problems == {} and instance.status == "idle", ssh.problems
    return ssh, ssh.installed[instance.id]


def set_started_at(agent: RemoteAgent, when: float) -> None:
    """Make the agent's connection file say it started at `when` (host clock: this one)."""
    connection = Path(agent.directory) / "data" / "agent.json"
    info = json.loads(connection.read_text())
    info["started_at"] = when
    connection.write_text(json.dumps(info))


def long_running(agent: RemoteAgent) -> None:
    """As if it had been running for an hour: past the wait a fresh start gets, so the short
    `/health` timeout applies (a test need not wait for the agent to grow that old)."""
    set_started_at(agent, time.time() - 3600)


async def answers(ssh: SSHProvider) -> bool:
    client = await ssh.agent(ssh.host_instances(FLEET)[0])
    return (await client.health()).status == "ok"


def restarted_warning(caplog: pytest.LogCaptureFixture, host: str, pid: int) -> bool:
    said = f"{host}: agent (pid {pid}) did not answer within {HEALTH_TIMEOUT:g}s; restarted it"
    return any(r.levelno == logging.WARNING and r.getMessage() == said for r in caplog.records)


async def test_a_stopped_agent_is_stopped_for_good_and_another_started(
    ssh_hosts: SSHTestHosts,
    tmp_path: Path,
    bundle: AgentBundle,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, installed = await provision(ssh_hosts, tmp_path, bundle, "h1")
    await first.close()
    long_running(installed)
    os.kill(installed.pid, signal.SIGSTOP)
    try:
        second, again = await provision(ssh_hosts, tmp_path, bundle, "h1")
    finally:
        if running(installed.pid):
            os.kill(installed.pid, signal.SIGCONT)  # a failed test leaves no stopped agent
    try:
        assert again.replaced_pid == installed.pid and again.pid != installed.pid
        assert not again.already_running and not again.uploaded
        wait_until(lambda: not running(installed.pid), "the stopped agent exits")
        assert running(again.pid) and await answers(second)
        host = ssh_hosts["h1"].address
        assert restarted_warning(caplog, host, installed.pid), caplog.text
        data = Path(again.directory) / "data"
        assert int((data / "agent.pid").read_text()) == again.pid
    finally:
        await second.terminate(second.host_instances(FLEET))
        await second.close()


async def test_an_agent_in_another_network_namespace_is_replaced_by_one_in_the_hosts(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    """Its process and files are the host's (pid, command line, connection file all match),
    but the port it listens on is in another namespace: the tunnel cannot reach it."""
    first, installed = await provision(ssh_hosts, tmp_path, bundle, "h1")
    try:
        await first.terminate(first.host_instances(FLEET))
    finally:
        await first.close()
    where = Path(installed.directory)
    agent = [system_python(), "-I", str(where / "agent.pyz")]
    data = ["--data-dir", str(where / "data")]
    started = subprocess.run([*agent, "start", *data], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    elsewhere = int(json.loads(started.stdout)["pid"])
    try:
        second, again = await provision(ssh_hosts, tmp_path, bundle, "h1")
        try:
            assert again.replaced_pid == elsewhere and again.pid != elsewhere
            wait_until(lambda: not running(elsewhere), "the unreachable agent exits")
            assert await answers(second)
        finally:
            await second.terminate(second.host_instances(FLEET))
            await second.close()
    finally:
        subprocess.run([*agent, "stop", *data], capture_output=True)


async def test_an_agent_that_may_still_be_starting_gets_the_wait_a_fresh_start_gets(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    """Not restarted while younger than the start's wait: it answers once it goes on (SIGCONT
    when the install's request is waiting in its accept queue), and is reused as it is."""
    first, installed = await provision(ssh_hosts, tmp_path, bundle, "h1")
    await first.close()
    # as if it had just started: a start time ahead of the host's clock counts as just now,
    # so how fast this test gets to the install does not matter
    set_started_at(installed, time.time() + 3600)
    os.kill(installed.pid, signal.SIGSTOP)
    netns = ssh_hosts["h1"].netns

    def queued() -> bool:
        listening = subprocess.run(
            ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{installed.port}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        return len(listening) > 1 and int(listening[1]) > 0  # Recv-Q: connections to accept

    def go_on_when_asked() -> None:
        try:
            wait_until(queued, "the install asks the stopped agent")
        finally:
            os.kill(installed.pid, signal.SIGCONT)

    resumer = threading.Thread(target=go_on_when_asked)
    resumer.start()
    try:
        second, again = await provision(ssh_hosts, tmp_path, bundle, "h1")
    finally:
        resumer.join()
    try:
        assert again.pid == installed.pid and again.already_running
        assert again.replaced_pid is None
        assert await answers(second)
    finally:
        await second.terminate(second.host_instances(FLEET))
        await second.close()


async def test_a_stopped_agent_of_a_systemd_unit_is_restarted_through_the_unit(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    first, installed = await provision(ssh_hosts, tmp_path, bundle, "sysd")
    await first.close()
    assert installed.persistent
    long_running(installed)
    logged = len(calls(ssh_hosts))
    os.kill(installed.pid, signal.SIGSTOP)
    try:
        second, again = await provision(ssh_hosts, tmp_path, bundle, "sysd")
    finally:
        if running(installed.pid):
            os.kill(installed.pid, signal.SIGCONT)
    try:
        assert again.replaced_pid == installed.pid and again.persistent
        wait_until(lambda: not running(installed.pid), "the stopped agent exits")
        assert running(again.pid) and await answers(second)
        # the unit stopped (so Restart= brings nothing back meanwhile), then started again
        made = calls(ssh_hosts)[logged:]
        assert made.index(["stop", UNIT]) < made.index(["enable", "--now", "--quiet", UNIT])
    finally:
        await second.terminate(second.host_instances(FLEET))
        await second.close()
