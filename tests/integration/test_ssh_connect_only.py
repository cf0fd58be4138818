"""An SSH provider that starts no agent (`start_agents=False`, as watch's machines are): it
talks to the agent that runs on a host, and a host without one does not answer, whatever is
asked of it (refresh, a request), instead of getting an agent installed or started again.

Real sshd hosts in network namespaces (tests/infra/ssh_hosts.py), sharing this machine's
process table: the agents are found by their command line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.errors import AgentError
from dstack_plan.providers.ssh.install import AgentBundle
from dstack_plan.providers.ssh.provider import SSHProvider
from tests.e2e.test_ssh_fleet import agents_running
from tests.infra.ssh_hosts import SSHTestHosts
from tests.integration.test_ssh_agent import FLEET, OFFER, bundle, provider  # noqa: F401

pytestmark = pytest.mark.ssh


def _connect_only(hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle) -> SSHProvider:  # noqa: F811
    found = provider(hosts, tmp_path, bundle, names=("h1",))
    found.start_agents = False
    return found


async def test_only_an_agent_that_runs_is_talked_to_none_is_started(
    ssh_hosts: SSHTestHosts,
    tmp_path: Path,
    bundle: AgentBundle,  # noqa: F811
) -> None:
    remote = tmp_path / "remote"
    watching = _connect_only(ssh_hosts, tmp_path, bundle)
    applying = provider(ssh_hosts, tmp_path, bundle, names=("h1",))
    [instance] = watching.host_instances(FLEET)
    try:
        # nothing installed yet: the host does not answer, and gets no agent
        [seen] = await watching.refresh([instance])
        assert seen.status == "pending" and seen.resources is None
        assert "no agent runs there" in watching.problems[instance.name]
        with pytest.raises(AgentError, match="no agent runs there"):
            await (await watching.agent(instance)).host_facts()
        assert agents_running(remote) == set()

        [created] = await applying.create_instances(FLEET, OFFER, 1)
        started = applying.installed[created.id]
        facts = await (await watching.agent(instance)).host_facts()
        assert facts.cpus >= 1
        assert watching.installed[instance.id].pid == started.pid  # found, not started

        # stopped (destroy), the agent is not brought back by the next request or refresh
        await applying.terminate([created])
        assert agents_running(remote) == set()
        with pytest.raises(AgentError, match="no agent runs there"):
            await (await watching.agent(instance)).host_facts()
        [seen] = await watching.refresh([created])
        assert (
            seen.status == "pending" and "no agent runs there" in watching.problems[instance.name]
        )
        assert agents_running(remote) == set()
    finally:
        await applying.terminate(applying.host_instances(FLEET))
        await applying.close()
        await watching.close()
