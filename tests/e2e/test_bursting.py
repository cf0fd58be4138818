"""Bursting from on-prem to the cloud: `fleets: [onprem, burst]` runs on the on-prem GPU
while it is free, and a run that finds it busy gets a new machine of the cloud fleet, which
watch releases once it has been idle for the run's idle duration (a fake clock).

On-prem is the namespace host `gpu` (one fake A100); the cloud fleet's machine is `gpu2`
(another fake A100, 10.213.k.18): the fleet's subnet has everything below it reserved, so it
is the first address moto gives out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_cloud_fleet import cloud_project, ec2, stop_agents, tagged  # noqa: F401
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_ssh_fleet import remote  # noqa: F401 - fixture
from tests.e2e.test_watch_pending import tick
from tests.infra.ssh_hosts import SUBNET, SSHTestHosts

pytestmark = pytest.mark.ssh

FLEETS = """\
type: fleet
name: onprem
ssh_config:
  user: root
  identity_file: {key}
  hosts: [{onprem}]
---
type: fleet
name: burst
nodes: 0..1
backends: [aws]
spot_policy: auto
"""
TASK = """\
type: task
name: {name}
fleets: [onprem, burst]
resources: {{gpu: "A100:1..8"}}
commands: ["echo {name} on $(hostname)", "sleep {seconds}"]
stop_duration: 1s
"""


@pytest.fixture
def hybrid(
    tmp_path: Path,
    cli_env: dict[str, str],
    moto_server: Any,
    ec2: Any,  # noqa: F811
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> Any:
    project = cloud_project(
        tmp_path / "project",
        cli_env,
        moto_server,
        ec2,
        ssh_hosts,
        subnet=f"{SUBNET}.0/27",
        reserved=(f"{SUBNET}.4/30", f"{SUBNET}.8/29", f"{SUBNET}.16/31"),
    )
    (project / "fleets.dstack.yml").write_text(
        FLEETS.format(key=ssh_hosts.client_key, onprem=ssh_hosts["gpu"].address)
    )
    yield project
    stop_agents(remote)


def change_of(plan: dict[str, Any], address: str) -> dict[str, Any]:
    return next(c for c in plan["resource_changes"] if c["address"] == address)


def test_a_run_that_finds_on_prem_busy_bursts_to_a_new_cloud_machine_released_when_idle(
    dstack: Dstack,
    hybrid: Path,
    ec2: Any,  # noqa: F811
    ssh_hosts: SSHTestHosts,
    cli_env: dict[str, str],
    agent_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = hybrid
    (project / "first.dstack.yml").write_text(TASK.format(name="first", seconds=120))
    applied = dstack("apply", "-y", timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.first", {"running"}, timeout=60)
    first = state(project)["resources"]["task.first"]["attributes"]
    assert first["fleet"] == "onprem" and tagged(ec2, project) == {}  # fits on-prem: no cloud

    (project / "second.dstack.yml").write_text(TASK.format(name="second", seconds=15))
    planned = dstack("plan", "--json")
    assert planned.returncode == 0, planned.stderr
    placement = change_of(json.loads(planned.stdout), "task.second")["placement"]
    assert placement["fleet"] == "burst" and placement["provider"] == "aws"
    assert placement["offer"]["count"] == 1 and placement["offer"]["spot"] is True
    assert placement["offer"]["instance_type"] in {"p4d.24xlarge", "p4de.24xlarge"}
    assert placement["note"].startswith("burst: onprem cannot take it now (")
    assert "1 new machine p4d" in placement["note"]
    shown = dstack("plan")
    assert "placement: fleet burst (aws)" in shown.stdout and "burst: onprem" in shown.stdout

    burst = dstack("apply", "-y", timeout=300)
    assert burst.returncode == 0, burst.stdout + burst.stderr
    gpu2 = ssh_hosts["gpu2"].address
    assert set(tagged(ec2, project)) == {gpu2}
    resources = state(project)["resources"]
    assert [i["hostname"] for i in resources["fleet.burst"]["attributes"]["instances"]] == [gpu2]
    assert resources["task.second"]["attributes"]["fleet"] == "burst"
    assert resources["task.second"]["attributes"]["price_per_hour"] == 0.0  # the fleet's
    # a third run finds on-prem and the fleet's one machine busy, and nodes.max reached
    (project / "third.dstack.yml").write_text(TASK.format(name="third", seconds=1))
    waiting = dstack("plan", "--json")
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    left = change_of(json.loads(waiting.stdout), "task.third")["placement"]
    assert left["fleet"] == "onprem" and left["placed"] is False, left
    assert "; fleet burst: nodes.max 1 reached (1 up; needs 1 more)" in left["note"], left
    (project / "third.dstack.yml").unlink()
    wait_for_status(dstack, "task.second", {"done"}, timeout=60)
    assert dstack("logs", "second").stdout == "second on gpu2\n"

    # the machine stays the fleet's, and nothing is planned
    settled = dstack("plan", "--detailed-exitcode")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    (machine,) = state(project)["resources"]["fleet.burst"]["attributes"]["instances"]
    assert machine["idle_duration"] == 300  # the run's default 5m, shorter than the fleet's 3d

    # watch releases it once idle for that long; the on-prem host is never released
    for key, value in cli_env.items():
        if key.startswith(("AWS_", "DSTACK_PLAN_")) or key == "HOME":
            monkeypatch.setenv(key, value)
    now = time.time()
    tick(project, agent_dir, now)
    (seen,) = state(project)["resources"]["fleet.burst"]["attributes"]["instances"]
    assert seen["idle_since"] == now and set(tagged(ec2, project)) == {gpu2}
    tick(project, agent_dir, now + 299)
    assert set(tagged(ec2, project)) == {gpu2}
    tick(project, agent_dir, now + 301)
    assert tagged(ec2, project) == {}
    fleet = state(project)["resources"]["fleet.burst"]
    assert fleet["attributes"]["instances"] == [] and fleet["attributes"]["hosts"] == []
    assert len(state(project)["resources"]["fleet.onprem"]["attributes"]["hosts"]) == 1

    destroyed = dstack("destroy", "-y", timeout=300)
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert tagged(ec2, project) == {}


VOLUME = """\
type: volume
name: data
backend: aws
region: us-east-1
availability_zone: us-east-1c
size: 1GB
"""


def test_a_run_with_a_zoned_volume_bursts_to_a_machine_planned_in_its_zone(
    dstack: Dstack, hybrid: Path
) -> None:
    project = hybrid
    fleets = dstack("apply", "-y", timeout=300)  # the cloud fleet, still without machines
    assert fleets.returncode == 0, fleets.stdout + fleets.stderr
    (project / "data.dstack.yml").write_text(VOLUME)
    task = TASK.format(name="reader", seconds=1) + "volumes: [data:/data]\n"
    (project / "reader.dstack.yml").write_text(task)
    planned = dstack("plan", "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    placement = change_of(json.loads(planned.stdout), "task.reader")["placement"]
    # on-prem cannot mount an EBS volume: the cloud fleet gets a machine in the volume's zone
    assert placement["fleet"] == "burst", placement
    assert placement["offer"]["zones"] == ["us-east-1c"], placement
    assert "in aws us-east-1 (us-east-1c)" in placement["note"], placement

    # a fleet whose zones leave the volume's out cannot take it, and says so
    fleets = (project / "fleets.dstack.yml").read_text()
    zoned = fleets.replace(
        "spot_policy: auto", "spot_policy: auto\navailability_zones: [us-east-1a]"
    )
    (project / "fleets.dstack.yml").write_text(zoned)
    changed = dstack("apply", "-y", "--target", "fleet.burst", timeout=300)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    refused = dstack("plan")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (
        "fleet burst: its volumes are in us-east-1c, which is not one of the fleet's "
        "availability_zones (us-east-1a)"
    ) in refused.stderr, refused.stderr
