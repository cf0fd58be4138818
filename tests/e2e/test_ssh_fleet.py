"""SSH fleets through plan and apply, against real sshd hosts in network namespaces.

The hosts share this machine's file system and process table: every test installs the agent
under its own absolute `DSTACK_PLAN_SSH_AGENT_DIR`, and finds the agents it left by their
command line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dstack_plan.errors import DstackPlanError
from dstack_plan.project import Project
from tests.e2e.conftest import Dstack
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


@pytest.fixture
def remote(tmp_path: Path, cli_env: dict[str, str]) -> Path:
    """The hosts' agent dir of this test (what it leaves running there is stopped after it:
    `tests/conftest.py`)."""
    cli_env["HOME"] = str(tmp_path / "home")  # no ~/.ssh/known_hosts of root's in the way
    cli_env["DSTACK_PLAN_SSH_AGENT_DIR"] = str(tmp_path / "remote")
    return tmp_path / "remote"


def fleet_text(hosts: SSHTestHosts, name: str, *names: str, **ssh: str) -> str:
    """An SSH fleet `name` of the test hosts `names`, logging in as root with the test key
    unless `ssh` says otherwise (`user`, `identity_file`, `port`, ...)."""
    settings = {"user": "root", "identity_file": str(hosts.client_key), **ssh}
    lines = "".join(f"  {key}: {value}\n" for key, value in settings.items())
    listed = "".join(f"    - {hosts[n].address}\n" for n in names)
    return f"type: fleet\nname: {name}\nssh_config:\n{lines}  hosts:\n{listed}"


def write_fleet(project: Path, hosts: SSHTestHosts, *names: str) -> None:
    (project / "fleet.dstack.yml").write_text(fleet_text(hosts, "onprem", *names))


def agents_running(remote: Path) -> set[str]:
    """The node names whose agent process runs now (`<remote>/hosts/<node>/agent.pyz`)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        for word in words:
            text = word.decode(errors="replace")
            if text.startswith(f"{remote}/hosts/") and text.endswith("/agent.pyz"):
                found.add(text.split("/")[-2])
    return found


def hosts_json(dstack: Dstack) -> dict[str, dict]:
    done = dstack("fleet", "list", "onprem", "--json")
    assert done.returncode == 0, done.stderr
    return {h["name"]: h for h in json.loads(done.stdout)["fleets"][0]["hosts"]}


def test_apply_update_and_destroy_an_ssh_fleet(
    dstack: Dstack, tmp_path: Path, ssh_hosts: SSHTestHosts, remote: Path
) -> None:
    project = tmp_path / "project"
    h1, h2, h3, gpu = (ssh_hosts[n].address for n in ("h1", "h2", "h3", "gpu"))
    write_fleet(project, ssh_hosts, "h1", "h2", "h3")

    planned = dstack("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert "1 to add" in planned.stdout

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    hosts = hosts_json(dstack)
    assert list(hosts) == [h1, h2, h3]
    for host in hosts.values():
        assert host["status"] == "idle" and host["problem"] is None
        assert host["resources"]["cpus"] >= 1 and host["resources"]["memory_gb"] > 0
        assert host["agent_version"] and host["host_key_fingerprint"].startswith("SHA256:")
    assert agents_running(remote) == {"h1", "h2", "h3"}

    again = dstack("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr

    write_fleet(project, ssh_hosts, "h1", "h2", "h3", "gpu")
    added = dstack("plan", "--detailed-exitcode")
    assert added.returncode == 2 and "1 to change" in added.stdout, added.stdout
    assert dstack("apply", "-y").returncode == 0
    hosts = hosts_json(dstack)
    assert list(hosts) == [h1, h2, h3, gpu]
    assert [g["name"] for g in hosts[gpu]["resources"]["gpus"]] == ["NVIDIA Fake A100"]
    assert agents_running(remote) == {"h1", "h2", "h3", "gpu"}

    write_fleet(project, ssh_hosts, "h1", "h3", "gpu")
    removed = dstack("apply", "-y")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert "1 changed" in removed.stdout or "1 to change" in removed.stdout, removed.stdout
    assert list(hosts_json(dstack)) == [h1, h3, gpu]
    assert agents_running(remote) == {"h1", "h3", "gpu"}  # h2's agent was stopped

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert agents_running(remote) == set()


def test_a_host_whose_sshd_is_stopped_fails_alone(
    dstack: Dstack, tmp_path: Path, ssh_hosts: SSHTestHosts, remote: Path
) -> None:
    project = tmp_path / "project"
    h3 = ssh_hosts["h3"].address
    write_fleet(project, ssh_hosts, "h1", "h2", "h3")
    ssh_hosts.stop("h3")
    try:
        applied = dstack("apply", "-y")
    finally:
        ssh_hosts.start("h3")
    try:
        assert applied.returncode == 1
        output = applied.stdout + applied.stderr
        reason = f"{h3}: connection to {h3}:22 refused: is sshd running"
        assert f"1 of 3 host(s) failed: {reason}" in output
        assert "Traceback" not in output
        assert agents_running(remote) == {"h1", "h2"}  # the others were provisioned
    finally:
        assert dstack("destroy", "-y").returncode == 0
    assert agents_running(remote) == set()


def test_a_changed_host_key_fails_that_host_until_trusted(
    dstack: Dstack, tmp_path: Path, ssh_hosts: SSHTestHosts, remote: Path
) -> None:
    project = tmp_path / "project"
    h1 = ssh_hosts["h1"].address
    write_fleet(project, ssh_hosts, "h1", "h2")
    assert dstack("apply", "-y").returncode == 0
    pinned = hosts_json(dstack)[h1]["host_key_fingerprint"]
    try:
        ssh_hosts.new_host_key("h1")
        done = dstack("fleet", "list", "--refresh", "--json")
        assert done.returncode == 0, done.stderr
        hosts = {h["name"]: h for h in json.loads(done.stdout)["fleets"][0]["hosts"]}
        assert hosts[h1]["status"] == "unreachable"
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in hosts[h1]["problem"]
        assert f"the pinned key has {pinned}" in hosts[h1]["problem"]
        assert hosts[ssh_hosts["h2"].address]["status"] == "idle"  # the other is unaffected
        assert dstack("plan", "--detailed-exitcode").returncode == 0  # reported, not raised
        # exec checks the keys state pinned too: the changed host fails, the other runs
        ran = dstack("exec", "--json", "--", "true")
        assert ran.returncode == 1, ran.stdout + ran.stderr
        results = {h["host"]: h for h in json.loads(ran.stdout)["hosts"]}
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in (results[h1]["error"] or "")
        assert results[ssh_hosts["h2"].address]["exit_code"] == 0

        trusted = dstack("fleet", "trust", "onprem", h1)
        assert trusted.returncode == 0, trusted.stdout + trusted.stderr
        new = hosts_json(dstack)[h1]
        assert new["status"] == "idle" and new["host_key_fingerprint"] not in (None, pinned)
        assert f"Forgot the pinned key {pinned} of {h1}" in trusted.stdout
    finally:
        assert dstack("destroy", "-y").returncode == 0
    assert agents_running(remote) == set()


def test_a_long_lived_process_uses_a_key_trusted_while_it_runs(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what `dstack watch` does: one Project, its SSH connections kept across ticks
    for name in ("HOME", "DSTACK_PLAN_SSH_AGENT_DIR", "DSTACK_PLAN_AGENT_DIR"):
        monkeypatch.setenv(name, cli_env[name])
    project_dir = tmp_path / "project"
    h1 = ssh_hosts["h1"].address
    write_fleet(project_dir, ssh_hosts, "h1")
    assert dstack("apply", "-y").returncode == 0

    async def scenario() -> None:
        project = Project(project_dir)
        try:
            state = project.backend.read().state
            ssh_hosts.new_host_key("h1")  # the host was reinstalled while watch ran
            with pytest.raises(DstackPlanError, match="REMOTE HOST IDENTIFICATION HAS CHANGED"):
                await (await project.machines.agent("onprem", h1, state)).list_jobs()
            trusted = await asyncio.to_thread(dstack, "fleet", "trust", "onprem", h1)
            assert trusted.returncode == 0, trusted.stdout + trusted.stderr
            state = project.backend.read().state  # as the next tick reads it
            assert await (await project.machines.agent("onprem", h1, state)).list_jobs() == []
        finally:
            await project.close()

    try:
        asyncio.run(scenario())
    finally:
        assert dstack("destroy", "-y").returncode == 0


def test_a_fleet_behind_a_jump_host(
    dstack: Dstack, tmp_path: Path, ssh_hosts: SSHTestHosts, remote: Path
) -> None:
    # `inner` is reachable only through `jump` (the namespace network has no other route)
    project = tmp_path / "project"
    inner, jump = ssh_hosts["inner"].address, ssh_hosts["jump"].address
    (project / "fleet.dstack.yml").write_text(
        "type: fleet\nname: onprem\nssh_config:\n  user: root\n"
        f"  identity_file: {ssh_hosts.client_key}\n"
        f"  proxy_jump: {{hostname: {jump}, user: root, identity_file: {ssh_hosts.client_key}}}\n"
        f"  hosts:\n    - {inner}\n"
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    try:
        host = hosts_json(dstack)[inner]
        assert host["status"] == "idle" and host["resources"]["cpus"] >= 1
        assert agents_running(remote) == {"inner"}
        ran = dstack("exec", "--json", "--", "hostname")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout)["hosts"][0]["stdout"] == "inner\n"
        assert dstack("plan", "--detailed-exitcode").returncode == 0  # refreshed via the jump
    finally:
        assert dstack("destroy", "-y").returncode == 0
    assert agents_running(remote) == set()
