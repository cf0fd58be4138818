"""`dstack fleet list` says whether each host's agent comes back after a reboot.

`h1` has no systemd (the agent runs detached: it will not survive a reboot); `sysd` has a fake
`systemctl` and a stand-in systemd root (tests/infra/ssh_hosts.py), so its agent runs as an
enabled unit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_ssh_fleet import agents_running, remote, write_fleet  # noqa: F401
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


def test_fleet_list_tells_a_detached_agent_from_a_systemd_unit(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    h1, sysd = ssh_hosts["h1"].address, ssh_hosts["sysd"].address
    write_fleet(tmp_path / "project", ssh_hosts, "h1", "sysd")
    try:
        applied = dstack("apply", "-y")
        assert applied.returncode == 0, applied.stdout + applied.stderr

        listed = dstack("fleet", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        hosts = {h["name"]: h for h in json.loads(listed.stdout)["fleets"][0]["hosts"]}
        assert hosts[h1]["agent_persistent"] is False
        assert hosts[sysd]["agent_persistent"] is True

        table = dstack("fleet", "list")
        assert table.returncode == 0, table.stderr
        rows = {line.split()[1]: line for line in table.stdout.splitlines()[1:3]}
        assert rows[h1].endswith(", detached") and rows[sysd].endswith(", systemd")
        assert (
            f"agent: detached on {h1} (will not survive a reboot; the next command that needs "
            "it starts it again)"
        ) in table.stdout
        assert sysd not in table.stdout.splitlines()[-1]
    finally:
        destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert agents_running(remote) == set()
    assert not list((ssh_hosts.systemd_root / "etc/systemd/system").glob("*.service"))
