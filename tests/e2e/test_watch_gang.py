"""`dstack watch` stops the surviving nodes of a failed multi-node task that no one attached
to, and commits what it found; with real agents on namespace SSH hosts."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_runs import fleet, task
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


def statuses(dstack: Dstack) -> dict[int, str]:
    rows = json.loads(dstack("ps", "--json", "-a").stdout)
    row = next(r for r in rows if r["address"] == "task.gang")
    return {j["node"]: j["status"] for j in row["jobs"]}


def test_watch_stops_the_other_nodes_when_one_failed(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "h1", "h2", "h3"))
    script = 'if [ "$DSTACK_NODE_RANK" = 1 ]; then exit 3; fi; sleep 300'
    (project / "gang.dstack.yml").write_text(task("gang", 3, [script]))
    assert dstack("apply", "-y").returncode == 0
    deadline = time.monotonic() + 30
    while statuses(dstack).get(1) != "failed":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert statuses(dstack)[0] == "running"  # nobody attached: the others run on

    ticked = dstack("watch", "--once")
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    # from what apply recorded: `submitted`, or `running` when the jobs started in time
    assert re.search(r"task\.gang: (submitted|running) -> failed\n", ticked.stdout), ticked.stdout
    assert state(project)["resources"]["task.gang"]["status"] == "failed"
    deadline = time.monotonic() + 30
    while any(s == "running" for s in statuses(dstack).values()):
        assert time.monotonic() < deadline, statuses(dstack)
        time.sleep(0.3)
    assert dstack("destroy", "-y").returncode == 0
