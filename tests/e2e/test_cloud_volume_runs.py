"""A network volume in runs, on a cloud fleet: the plan puts the run on a machine in the
volume's zone, apply attaches the EBS volume (moto) to that machine before the job starts,
the agent formats it once and Docker mounts it, watch detaches it when the job is done, and
the next run finds what the first one wrote.

The "booted" machine is namespace SSH host h2 (see test_cloud_fleet); the attached disk is a
loop device behind the udev link an EC2 Nitro machine has for the volume
(`/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol...`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_cloud_fleet import cloud, ec2, tagged  # noqa: F401, F811 - fixtures
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_ssh_fleet import remote  # noqa: F401 - fixture
from tests.infra.docker_images import ensure_busybox_image
from tests.infra.loop_devices import udev_link
from tests.infra.moto_server import REGION
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.docker]

FLEET = """\
type: fleet
name: burst
nodes: 1
backends: [aws]
resources: {cpu: 2.., memory: 8GB..}
"""
VOLUME = f"""\
type: volume
name: {{name}}
backend: aws
region: {REGION}
availability_zone: {{zone}}
size: 1GB
"""
TASK = """\
type: task
name: {name}
fleets: [burst]
image: {image}
volumes: [{volume}:/data]
commands: ["{command}"]
stop_duration: 1s
"""


def attachments(client: Any, volume_id: str) -> list[str]:
    (volume,) = client.describe_volumes(VolumeIds=[volume_id])["Volumes"]
    return [a["InstanceId"] for a in volume["Attachments"]]


def test_a_run_mounts_a_cloud_volume_that_is_detached_when_done_and_keeps_its_data(
    dstack: Dstack,
    cloud: Path,  # noqa: F811
    ec2: Any,  # noqa: F811
    ssh_hosts: SSHTestHosts,
    docker_client: Any,
    blank_disk: str,
) -> None:
    project = cloud
    image = ensure_busybox_image(docker_client)
    (project / "fleet.dstack.yml").write_text(FLEET)
    made = dstack("apply", "-y", timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    (machine,) = state(project)["resources"]["fleet.burst"]["attributes"]["instances"]
    zone = machine["zone"]  # the zone of the fleet's subnet
    other = next(z for z in ("us-east-1a", "us-east-1b") if z != zone)
    (project / "volume.dstack.yml").write_text(
        VOLUME.format(name="data", zone=zone) + "---\n" + VOLUME.format(name="far", zone=other)
    )
    applied = dstack("apply", "-y", timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    volume = state(project)["resources"]["volume.data"]["attributes"]
    assert volume["zone"] == zone

    far = TASK.format(name="far", image=image, volume="far", command="true")
    (project / "far.dstack.yml").write_text(far)
    refused = dstack("plan")
    assert refused.returncode == 1, refused.stdout
    assert f"lacks label zone={other} (has zone={zone})" in refused.stderr, refused.stderr
    (project / "far.dstack.yml").unlink()
    h2 = ssh_hosts["h2"].address
    link = f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume['id'].replace('-', '')}"

    with udev_link(link, blank_disk):
        write = TASK.format(
            name="write", image=image, volume="data", command="echo kept > /data/f"
        )
        (project / "write.dstack.yml").write_text(write)
        planned = dstack("plan", "--json")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        (run,) = [
            c
            for c in json.loads(planned.stdout)["resource_changes"]
            if c["address"] == "task.write"
        ]
        assert run["placement"]["fleet"] == "burst" and run["placement"]["hosts"] == [h2]
        ran = dstack("apply", "-y", timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert attachments(ec2, volume["id"]) == [machine["id"]]
        wait_for_status(dstack, "task.write", {"done"}, timeout=60)

        ticked = dstack("watch", "--once")  # the job is done: the volume leaves the machine
        assert ticked.returncode == 0, ticked.stdout + ticked.stderr
        assert attachments(ec2, volume["id"]) == []
        assert state(project)["resources"]["volume.data"]["attributes"]["attached_to"] == []

        (project / "write.dstack.yml").unlink()
        read = TASK.format(
            name="read", image=image, volume="data", command="cat /data/f; exec sleep 300"
        )
        (project / "read.dstack.yml").write_text(read)
        again = dstack("apply", "-y", timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        wait_for_status(dstack, "task.read", {"running"}, timeout=60)
        deadline = time.monotonic() + 30
        while (logs := dstack("logs", "read")).stdout.strip() != "kept":
            assert time.monotonic() < deadline, logs.stdout + logs.stderr  # formatted only once
            time.sleep(0.3)
        assert attachments(ec2, volume["id"]) == [machine["id"]]

        (project / "read.dstack.yml").unlink()  # the run goes: its volume leaves at once
        removed = dstack("apply", "-y", timeout=300)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert attachments(ec2, volume["id"]) == []

        destroyed = dstack(
            "destroy",
            "-y",
            "--allow-destroy",
            "volume.data",
            "--allow-destroy",
            "volume.far",
            timeout=300,
        )
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert tagged(ec2, project) == {}
    assert state(project)["resources"] == {}
