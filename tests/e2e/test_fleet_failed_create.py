"""A fleet whose create failed before reaching a host can be fixed or destroyed: a host that
never got an agent needs nothing stopped, so neither the next apply (which replaces the
tainted fleet) nor destroy tries to reach it with the settings that failed. A host that got
an agent and cannot be reached at destroy is reported, and `destroy --force` forgets it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import agents_running, fleet_text, remote  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(600)]


def _fleet(project: Path, hosts: SSHTestHosts, names: tuple[str, ...], **ssh: str) -> None:
    (project / "fleet.dstack.yml").write_text(fleet_text(hosts, "onprem", *names, **ssh))


def _passphrase_key(directory: Path) -> Path:
    key = directory / "locked"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True
    )
    return key


def _broken_settings(tmp_path: Path, hosts: SSHTestHosts) -> list[tuple[str, dict[str, str]]]:
    """Each way a create fails before any host gets an agent."""
    return [
        ("wrong user", {"user": "nobody-here"}),
        ("passphrase key", {"identity_file": str(_passphrase_key(tmp_path))}),
        ("unreachable host", {"port": "2"}),
    ]


@pytest.mark.parametrize("then", ["fix", "destroy"])
def test_a_failed_create_is_fixed_by_the_yaml_or_destroyed(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    then: str,
) -> None:
    project = tmp_path / "project"
    names = ("h1", "h2")
    for case, broken in _broken_settings(tmp_path, ssh_hosts):
        _fleet(project, ssh_hosts, names, **broken)
        failed = dstack("apply", "-y")
        assert failed.returncode == 1, (case, failed.stdout + failed.stderr)
        entry = state(project)["resources"]["fleet.onprem"]
        assert entry["tainted"], case
        assert agents_running(remote) == set(), case
        if then == "fix":
            _fleet(project, ssh_hosts, names)
            fixed = dstack("apply", "-y")
            assert fixed.returncode == 0, (case, fixed.stdout + fixed.stderr)
            assert agents_running(remote) == set(names), case
        done = dstack("destroy", "-y")
        assert done.returncode == 0, (case, done.stdout + done.stderr)
        assert state(project)["resources"] == {}, case
        assert agents_running(remote) == set(), case


def test_a_missing_key_is_a_plan_error_and_destroy_needs_no_host(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    _fleet(project, ssh_hosts, ("h1",), identity_file=str(tmp_path / "no-such-key"))
    refused = dstack("apply", "-y")
    assert refused.returncode == 1
    assert "no-such-key: no such file" in refused.stderr
    assert "fleet.onprem" not in state(project).get("resources", {})
    _fleet(project, ssh_hosts, ("h1",))
    assert dstack("apply", "-y").returncode == 0


def test_destroy_reports_a_host_it_cannot_reach_and_force_forgets_it(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    h2 = ssh_hosts["h2"].address
    _fleet(project, ssh_hosts, ("h1", "h2"))
    assert dstack("apply", "-y").returncode == 0
    assert agents_running(remote) == {"h1", "h2"}
    ssh_hosts.stop("h2")
    try:
        refused = dstack("destroy", "-y")
        assert refused.returncode == 1
        output = refused.stdout + refused.stderr
        assert f"{h2}:" in output and "left there" in output and "--force" in output
        assert "fleet.onprem" in state(project)["resources"]  # nothing forgotten silently
        assert agents_running(remote) == {"h2"}  # h1 was cleaned all the same
        forced = dstack("destroy", "-y", "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert f"{h2}" in forced.stdout + forced.stderr  # says what it left behind
        assert state(project)["resources"] == {}
    finally:
        ssh_hosts.start("h2")


def test_a_fleet_with_an_unresolvable_host_is_destroyed(
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    agent_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process, where `.invalid` names fail to resolve as a resolver answers them
    (tests/infra/network_guard.py): the create fails on that host, its other host gets an
    agent, and destroy stops that one without trying the host that never resolved."""
    import asyncio

    from dstack_plan.errors import DstackPlanError
    from dstack_plan.plan.planner import PlanOptions
    from dstack_plan.project import Project

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DSTACK_PLAN_SSH_AGENT_DIR", str(remote))
    monkeypatch.setenv("DSTACK_PLAN_AGENT_DIR", str(agent_dir))
    project = tmp_path / "project"
    project.mkdir()
    _fleet(project, ssh_hosts, ("h1",))
    path = project / "fleet.dstack.yml"
    path.write_text(path.read_text() + "    - gone.invalid\n")

    async def apply(destroy: bool = False) -> bool:
        opened = Project(project)
        try:
            async with opened.locked("apply"):
                plan, _ = await opened.plan(PlanOptions(destroy=destroy))
                return (await opened.apply(plan)).ok
        finally:
            await opened.close()

    assert asyncio.run(apply()) is False
    assert state(project)["resources"]["fleet.onprem"]["tainted"]
    assert agents_running(remote) == {"h1"}
    try:
        assert asyncio.run(apply(destroy=True)) is True
    except DstackPlanError as e:
        raise AssertionError(f"destroy failed: {e}") from e
    assert state(project)["resources"] == {}
    assert agents_running(remote) == set()
