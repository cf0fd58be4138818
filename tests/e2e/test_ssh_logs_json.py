"""`dstack logs --json` and `--since` for a job on an SSH host, through its SSH connection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_ssh_fleet import agents_running, remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_runs import fleet, task
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


def test_json_lines_and_since_for_a_job_on_an_ssh_host(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "h1"))
    (project / "t.dstack.yml").write_text(task("two", 1, ["echo a", "sleep 1.5", "echo b"]))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.two", {"done"}, timeout=60)
    shown = dstack("logs", "two", "--json")
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [e["message"] for e in lines] == ["a", "b"]
    assert {e["host"] for e in lines} == {ssh_hosts["h1"].address}
    assert lines[0]["ts"] < lines[1]["ts"]
    assert dstack("logs", "two", "--since", lines[1]["ts"]).stdout == "b\n"
    assert dstack("destroy", "-y").returncode == 0
