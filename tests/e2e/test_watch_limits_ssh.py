"""`dstack exec` on an SSH host counts as activity of the dev environment running there (its
agent's `last_activity_at`, which watch's `inactivity_duration` counts from)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


def test_exec_on_a_host_touches_its_dev_environment(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    write_fleet(project, ssh_hosts, "h1")
    (project / "dev.dstack.yml").write_text(
        "type: dev-environment\nname: dev\nfleets: [onprem]\ninactivity_duration: 10m\n"
        f"stop_duration: 1s\n{RESOURCES}"
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "dev-environment.dev", {"running"}, timeout=60)
    (path,) = remote.rglob("jobs/*/job.json")

    def last_activity() -> float:
        return float(json.loads(path.read_text())["last_activity_at"])

    before = last_activity()
    time.sleep(0.05)
    done = dstack("exec", "--", "true")
    assert done.returncode == 0, done.stdout + done.stderr
    assert last_activity() > before
    assert dstack("destroy", "-y").returncode == 0
