"""A cloud fleet from offer to a running job: plan shows the instance type and price, apply
creates tagged EC2 instances (moto server, through boto3's own `AWS_ENDPOINT_URL`) and joins
them as SSH hosts, a task runs there, scale-in and destroy leave nothing tagged behind.

The "booted" machines are namespace SSH hosts: the fleet's subnet is the one the hosts are on
(10.213.k.8/29, whose first free addresses moto hands out in order: .12 = h2, .13 = h3) and
`public_ips: false` makes the private address the one SSH goes to.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_ssh_fleet import agents_running, remote  # noqa: F401 - fixture
from tests.infra.moto_server import CREDENTIALS, REGION
from tests.infra.ssh_hosts import SUBNET, SSHTestHosts

pytestmark = pytest.mark.ssh

FLEET = """\
type: fleet
name: burst
nodes: {nodes}
backends: [aws]
spot_policy: auto
resources: {{cpu: 2.., memory: 8GB..}}
"""
TASK = """\
type: task
name: where
fleets: [burst]
commands: ["echo on $(hostname)"]
stop_duration: 1s
"""


@pytest.fixture
def ec2(moto_server: Any) -> Any:
    import boto3

    return boto3.client("ec2", endpoint_url=moto_server.endpoint_url, region_name=REGION)


def cloud_project(
    project: Path,
    cli_env: dict[str, str],
    moto_server: Any,
    ec2: Any,
    ssh_hosts: SSHTestHosts,
    subnet: str = f"{SUBNET}.8/29",
    reserved: tuple[str, ...] = (),
) -> Path:
    """`project` with an aws backend whose instances land on the namespace hosts' subnet:
    `subnet` (moto gives out its addresses in order, after AWS's first three and the
    `reserved` CIDRs), reached on their private address as root with the hosts' key."""
    dot = project / ".dstack"
    (dot / "ssh").mkdir(parents=True)
    vpc = ec2.create_vpc(CidrBlock=f"{SUBNET}.0/24")["Vpc"]["VpcId"]
    subnet_id = ec2.create_subnet(VpcId=vpc, CidrBlock=subnet)["Subnet"]["SubnetId"]
    for cidr in reserved:
        ec2.create_subnet_cidr_reservation(
            SubnetId=subnet_id, Cidr=cidr, ReservationType="explicit"
        )
    (dot / "backends.yml").write_text(
        "backends:\n  - type: aws\n    regions: [us-east-1]\n"
        f"    vpc_id: {vpc}\n    subnet_ids: [{subnet_id}]\n    public_ips: false\n"
        "    ssh_user: root\n"
    )
    # the project key the machines are given: the one the namespace hosts accept
    shutil.copy(ssh_hosts.client_key, dot / "ssh" / "id_ed25519")
    shutil.copy(f"{ssh_hosts.client_key}.pub", dot / "ssh" / "id_ed25519.pub")
    cli_env.update(CREDENTIALS)
    cli_env["AWS_ENDPOINT_URL"] = moto_server.endpoint_url
    return project


@pytest.fixture
def cloud(
    tmp_path: Path,
    cli_env: dict[str, str],
    moto_server: Any,
    ec2: Any,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> Any:
    """A project whose machines are h2, then h3 (10.213.k.12 and .13)."""
    yield cloud_project(tmp_path / "project", cli_env, moto_server, ec2, ssh_hosts)
    stop_agents(remote)


def stop_agents(agents_dir: Path) -> None:
    """A terminated "instance" is a namespace host that lives on: stop what ran there."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(w.decode(errors="replace").startswith(f"{agents_dir}/") for w in words):
            try:
                os.kill(int(cmdline.parent.name), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


def tagged(ec2: Any, project: Path, fleet: str = "burst") -> dict[str, dict[str, Any]]:
    """Live instances tagged for this project's `fleet`, by private address."""
    found = ec2.describe_instances(
        Filters=[
            {"Name": "tag:dstack-plan:project", "Values": [project.name]},
            {"Name": "tag:dstack-plan:fleet", "Values": [fleet]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    return {i["PrivateIpAddress"]: i for r in found["Reservations"] for i in r["Instances"]}


def test_a_cloud_fleet_from_offer_to_a_running_job_and_back_to_nothing(
    dstack: Dstack,
    cloud: Path,
    ec2: Any,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = cloud
    (project / "fleet.dstack.yml").write_text(FLEET.format(nodes=2))

    planned = dstack("plan", "--json")
    assert planned.returncode == 0, planned.stderr
    change = json.loads(planned.stdout)["resource_changes"][0]
    offer = change["placement"]["offer"]
    assert offer["provider"] == "aws" and offer["region"] == REGION
    assert offer["spot"] is True and offer["count"] == 2  # spot_policy auto: spot first
    assert change["placement"]["price_per_hour"] == pytest.approx(2 * offer["price_per_hour"])
    text = dstack("plan")
    assert f"2 × {offer['instance_type']} in aws {REGION} (spot)" in text.stdout, text.stdout

    applied = dstack("apply", "-y", timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    h2, h3 = ssh_hosts["h2"].address, ssh_hosts["h3"].address
    live = tagged(ec2, project)
    assert set(live) == {h2, h3}
    assert {i["InstanceType"] for i in live.values()} == {offer["instance_type"]}
    assert all(i.get("InstanceLifecycle") == "spot" for i in live.values())
    entry = state(project)["resources"]["fleet.burst"]
    assert entry["status"] == "active"
    assert [i["hostname"] for i in entry["attributes"]["instances"]] == [h2, h3]
    assert [h["name"] for h in entry["attributes"]["hosts"]] == [h2, h3]
    assert all(h["agent_version"] and h["host_key"] for h in entry["attributes"]["hosts"])
    assert agents_running(remote) == {"h2", "h3"}
    assert "secret" not in json.dumps(entry).lower()
    trusted = dstack("fleet", "trust", "burst", h2)  # forgets one pin, keeps the machines
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    after = state(project)["resources"]["fleet.burst"]["attributes"]
    assert [i["hostname"] for i in after["instances"]] == [h2, h3]

    (project / "task.dstack.yml").write_text(TASK)
    placed = dstack("plan", "--json")
    assert placed.returncode == 0, placed.stderr
    run = next(
        c for c in json.loads(placed.stdout)["resource_changes"] if c["address"] == "task.where"
    )
    assert run["placement"]["fleet"] == "burst" and run["placement"]["hosts"][0] in (h2, h3)
    ran = dstack("apply", "-y", timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    wait_for_status(dstack, "task.where", {"done"}, timeout=60)
    logs = dstack("logs", "where")
    assert logs.stdout.strip() in ("on h2", "on h3"), logs.stdout + logs.stderr

    (project / "fleet.dstack.yml").write_text(FLEET.format(nodes=1))
    scaled_plan = dstack("plan")
    assert "fleet.burst will be updated in-place" in scaled_plan.stdout, scaled_plan.stdout
    assert "1 machine kept, 1 terminated" in scaled_plan.stdout
    scaled = dstack("apply", "-y", timeout=300)
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    assert set(tagged(ec2, project)) == {h2}  # the newest machine left
    assert [i["hostname"] for i in state(project)["resources"]["fleet.burst"]["attributes"][
        "instances"
    ]] == [h2]  # fmt: skip

    destroyed = dstack("destroy", "-y", timeout=300)
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert tagged(ec2, project) == {}
    assert state(project)["resources"] == {}
