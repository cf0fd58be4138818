"""The agent on SSH hosts: installed over SFTP, started detached, reached through a tunnel.

Real sshd hosts in network namespaces (tests/infra/ssh_hosts.py). They share this machine's
file system, so every test installs under its own absolute `agent_dir` in tmp_path; the
per-node directories (`hosts/<node name>/`) keep the hosts apart as on an NFS home.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.clock import FakeClock
from dstack_plan.providers.base import Instance, MachineResources, Offer
from dstack_plan.providers.registry import provider_class
from dstack_plan.providers.ssh.hostkeys import MemoryHostKeyStore
from dstack_plan.providers.ssh.install import AgentBundle, build_bundle
from dstack_plan.providers.ssh.models import SSHTarget
from dstack_plan.providers.ssh.provider import SSHProvider
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh

FLEET = "onprem"
OFFER = Offer(
    provider="ssh",
    instance_type="ssh",
    region="on-prem",
    resources=MachineResources(cpus=1, memory_gb=1, disk_gb=1),
    price_per_hour=0.0,
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> AgentBundle:
    return build_bundle(tmp_path_factory.mktemp("bundle") / "agent.pyz")


def targets(hosts: SSHTestHosts, *names: str) -> list[SSHTarget]:
    key = str(hosts.client_key)
    return [SSHTarget(hosts[n].address, "root", identity_file=key) for n in names]


def provider(
    hosts: SSHTestHosts,
    tmp_path: Path,
    bundle: AgentBundle,
    names: tuple[str, ...] = ("h1", "h2", "h3"),
    store: MemoryHostKeyStore | None = None,
    clock: FakeClock | None = None,
) -> SSHProvider:
    return SSHProvider(
        {FLEET: targets(hosts, *names)},
        host_keys=store or MemoryHostKeyStore(),
        # an empty known_hosts: only the pins decide (root's own ~/.ssh stays out)
        known_hosts=tmp_path / "known_hosts",
        bundle=bundle,
        agent_dir=str(tmp_path / "remote"),
        connect_timeout=5,
        clock=clock,
    )


async def agent_running(ssh: SSHProvider, instance: Instance, node: str) -> bool:
    """Ask the host itself (not through the provider's client) whether its agent runs."""
    target = ssh.fleets[instance.fleet][int(instance.name.rsplit("-", 1)[1])]
    conn = await ssh.pool.connect(target)
    where = f"{ssh.agent_dir}/hosts/{node}"
    done = await conn.run(f"python3 -I {where}/agent.pyz status --data-dir {where}/data")
    assert done.exit_status in (0, 3), done.stderr
    return done.exit_status == 0


def test_the_entry_point_names_the_ssh_provider() -> None:
    assert provider_class("ssh") is SSHProvider


def test_the_bundle_is_reproducible(bundle: AgentBundle, tmp_path: Path) -> None:
    again = build_bundle(tmp_path / "again.pyz")
    assert again.sha256 == bundle.sha256  # so a host with this build gets no upload


async def test_install_on_three_hosts_then_reuse_then_terminate(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    store = MemoryHostKeyStore()
    first = provider(ssh_hosts, tmp_path, bundle, store=store)
    try:
        instances = await first.create_instances(FLEET, OFFER, 3)
        assert first.problems == {}
        assert [i.name for i in instances] == [f"{FLEET}-0", f"{FLEET}-1", f"{FLEET}-2"]
        assert [i.status for i in instances] == ["idle"] * 3
        for instance in instances:
            assert instance.resources is not None and instance.resources.cpus >= 1
            assert instance.resources.memory_gb > 0
        installs = [first.installed[i.id] for i in instances]
        assert [r.uploaded for r in installs] == [True] * 3
        assert [r.already_running for r in installs] == [False] * 3
        assert [Path(r.directory).name for r in installs] == ["h1", "h2", "h3"]
        assert all(r.sha256 == bundle.sha256 for r in installs)
        assert all(r.token.get_secret_value() not in repr(r) for r in installs)
    finally:
        await first.close()

    # a later command (a new provider, the same pins): same build, so nothing is uploaded
    # and nothing started: the agents that run are used (how much quicker that is than an
    # install: benchmarks/ssh_host_faults.py)
    second = provider(ssh_hosts, tmp_path, bundle, store=store)
    try:
        again = await second.create_instances(FLEET, OFFER, 3)
        assert [i.status for i in again] == ["idle"] * 3
        reused = [second.installed[i.id] for i in again]
        assert [r.uploaded for r in reused] == [False] * 3
        assert [r.already_running for r in reused] == [True] * 3
        assert [r.pid for r in reused] == [r.pid for r in installs]  # the same agents

        # the agents answer through the tunnel, each from its own host
        for instance, node in zip(again, ("h1", "h2", "h3"), strict=True):
            client = await second.agent(instance)
            assert await second.agent(instance) is client
            assert (await client.health()).status == "ok"
            assert (await client.host_facts()).hostname == node

        # while an agent runs, an instance being terminated is still there
        terminating = [i.model_copy(update={"status": "terminating"}) for i in again]
        assert await second.refresh(terminating) == terminating

        await second.terminate(again)
        assert await second.refresh(terminating) == []  # gone: its agent no longer runs
        for instance, node in zip(again, ("h1", "h2", "h3"), strict=True):
            assert not await agent_running(second, instance, node)
        await second.terminate(again)  # idempotent: nothing runs, nothing fails
        assert second.installed == {}
    finally:
        await second.close()


async def test_a_process_job_runs_on_the_host_and_its_log_comes_back(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    ssh = provider(ssh_hosts, tmp_path, bundle, names=("h1", "h2"))
    try:
        instances = await ssh.create_instances(FLEET, OFFER, 2)
        client = await ssh.agent(instances[1])
        spec = JobSpec(id="j1", run_name="r", commands=["hostname", "echo from-the-host"])
        await client.submit(spec)
        info = await client.wait("j1", timeout=60)
        assert info.status.value == "done", info.termination_message
        assert await client.read_all_logs("j1") == b"h2\nfrom-the-host\n"
        streamed = b"".join([chunk.data async for chunk in client.follow_logs("j1")])
        assert streamed == b"h2\nfrom-the-host\n"
        # the other host never saw it
        other = await ssh.agent(instances[0])
        assert [j.id for j in await other.list_jobs()] == []
    finally:
        await ssh.terminate(instances)
        await ssh.close()


async def test_a_host_that_is_down_fails_alone_with_its_name(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    clock = FakeClock()
    ssh = provider(ssh_hosts, tmp_path, bundle, names=("h1", "h2", "h3", "bare"), clock=clock)
    address = ssh_hosts["h3"].address
    ssh_hosts.stop("h3")
    try:
        instances = await ssh.create_instances(FLEET, OFFER, 4)
        assert [i.status for i in instances] == ["idle", "idle", "pending", "pending"]
        assert instances[2].resources is None
        assert set(ssh.problems) == {f"{FLEET}-2", f"{FLEET}-3"}
        assert ssh.problems[f"{FLEET}-2"] == (
            f"{address}: connection to {address}:22 refused: is sshd running and listening on "
            "that port?"
        )
        bare = ssh_hosts["bare"].address
        assert ssh.problems[f"{FLEET}-3"].startswith(f"{bare}: pre-flight failed: python3 is not")

        # still down: refresh reports it, the others are refreshed
        refreshed = await ssh.refresh(instances[:3])
        assert [i.status for i in refreshed] == ["idle", "idle", "pending"]
        assert set(ssh.problems) == {f"{FLEET}-2", f"{FLEET}-3"}

        ssh_hosts.start("h3")
        # a host that keeps failing is dialled again only after a backoff (a watch tick
        # must not wait out a connect timeout on every request to it)
        assert [i.status for i in await ssh.refresh(refreshed)] == ["idle", "idle", "pending"]
        clock.advance(5)
        refreshed = await ssh.refresh(refreshed)
        assert [i.status for i in refreshed] == ["idle", "idle", "idle"]
        assert refreshed[2].resources is not None
        assert f"{FLEET}-2" not in ssh.problems
    finally:
        ssh_hosts.start("h3")
        await ssh.terminate(instances[:3])
        await ssh.close()


async def test_a_new_build_replaces_the_old_one_in_place(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    old = provider(ssh_hosts, tmp_path, bundle, names=("h1",))
    try:
        [instance] = await old.create_instances(FLEET, OFFER, 1)
        before = old.installed[instance.id]
    finally:
        await old.close()
    newer = build_bundle(tmp_path / "newer.pyz", include_docker=False)
    assert newer.sha256 != bundle.sha256
    new = provider(ssh_hosts, tmp_path, newer, names=("h1",))
    try:
        [instance] = await new.create_instances(FLEET, OFFER, 1)
        after = new.installed[instance.id]
        assert after.uploaded and not after.already_running
        assert after.pid != before.pid and after.directory == before.directory
        assert AgentBundle.of(Path(after.directory) / "agent.pyz").sha256 == newer.sha256
        assert (await (await new.agent(instance)).health()).status == "ok"
    finally:
        await new.terminate([instance])
        await new.close()


async def test_refresh_starts_the_agent_again_after_a_reboot(
    ssh_hosts: SSHTestHosts, tmp_path: Path, bundle: AgentBundle
) -> None:
    ssh = provider(ssh_hosts, tmp_path, bundle, names=("h2",))
    try:
        [instance] = await ssh.create_instances(FLEET, OFFER, 1)
        before = ssh.installed[instance.id]
        # the agent dies as in a reboot (not through the provider)
        conn = await ssh.pool.connect(ssh.fleets[FLEET][0])
        where = before.directory
        await conn.run(f"kill -9 {before.pid}; while kill -0 {before.pid}; do sleep 0.05; done")
        assert not await agent_running(ssh, instance, "h2")

        [refreshed] = await ssh.refresh([instance])
        assert refreshed.status == "idle" and refreshed.resources is not None
        assert ssh.problems == {}
        after = ssh.installed[instance.id]
        assert after.pid != before.pid and not after.uploaded and after.directory == where
        assert await agent_running(ssh, instance, "h2")
    finally:
        await ssh.terminate([instance])
        await ssh.close()
