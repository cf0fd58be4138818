"""`${{ groups[i].nodes[j].IP_ADDRESS }}` reaches the job resolved, through the CLI, with a
real agent on the local fleet."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status

TASK = """\
type: task
name: peers
commands:
  - echo "master at ${{ groups[0].nodes[0].IP_ADDRESS }}"
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def test_a_group_reference_is_the_nodes_address(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    assert dstack("init").returncode == 0
    (project / "peers.dstack.yml").write_text(TASK)
    assert dstack("validate").returncode == 0
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.peers", {"done"})
    logs = dstack("logs", "peers")
    assert "master at 127.0.0.1" in logs.stdout, logs.stdout + logs.stderr
    assert dstack("destroy", "-y").returncode == 0


def test_an_out_of_range_reference_stops_the_plan(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    assert dstack("init").returncode == 0
    (project / "peers.dstack.yml").write_text(TASK.replace("nodes[0]", "nodes[1]"))
    planned = dstack("plan")
    assert planned.returncode == 1
    assert planned.stderr.splitlines() == [
        "peers.dstack.yml:4:5: error: groups[0].nodes[1].IP_ADDRESS: out of range: "
        "group 0 has 1 node"
    ]
