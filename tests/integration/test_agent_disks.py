"""Network disks in containers: the agent finds the attached device, formats it once, and
Docker mounts it into the job; what one job writes the next one reads. Real loop devices
stand for the attached cloud disks."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import DiskMount, JobSpec
from tests.infra.agent_process import AgentProcess
from tests.infra.loop_devices import udev_link

pytestmark = pytest.mark.docker


def disk_job(job_id: str, image: str, devices: list[str], *commands: str) -> JobSpec:
    return JobSpec(
        id=job_id,
        run_name="disk-run",
        image=image,
        commands=list(commands),
        disks=[DiskMount(name="data", devices=devices, container_path="/data")],
    )


def fs_type(device: str) -> str:
    found = subprocess.run(["blkid", "-o", "value", "-s", "TYPE", device], capture_output=True)
    return found.stdout.decode().strip()


async def test_a_blank_disk_is_formatted_once_and_keeps_what_a_job_wrote(
    agent: AgentProcess, busybox_image: str, blank_disk: str
) -> None:
    client = agent.client()
    # named by the loop device (/dev is the machine's: a test name would be the same name in
    # another test run, or another pytest-xdist worker, at the same time)
    link = f"/dev/disk/by-id/dstack-plan-test-{Path(blank_disk).name}"
    with udev_link(link, blank_disk):
        # the first candidate never appears: the agent takes the next one that exists
        devices = ["/dev/disk/by-id/dstack-plan-test-absent", link]
        await client.submit(
            disk_job("w1", busybox_image, devices, "echo kept > /data/f", "mount | grep /data")
        )
        done = await client.wait("w1", timeout=60)
        logs = (await client.read_all_logs("w1")).decode()
        assert done.status.value == "done", logs + str(done.termination_message)
        assert "ext4" in logs and "/data" in logs
        assert fs_type(blank_disk) == "ext4"

        await client.submit(disk_job("r1", busybox_image, devices, "cat /data/f"))
        read = await client.wait("r1", timeout=60)
        assert read.status.value == "done", read.termination_message
        assert (await client.read_all_logs("r1")).decode().strip() == "kept"  # not reformatted


def write_dos_partition_table(device: str) -> None:
    """One Linux partition from sector 2048 on, in an MBR: what fdisk would write."""
    entry = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + (2048).to_bytes(4, "little")
    entry += (4096).to_bytes(4, "little")
    with open(device, "r+b") as f:
        f.seek(446)
        f.write(entry)
        f.seek(510)
        f.write(b"\x55\xaa")


async def test_a_disk_with_partitions_and_no_filesystem_is_refused_not_formatted(
    agent: AgentProcess, busybox_image: str, blank_disk: str, docker_client: Any
) -> None:
    client = agent.client()
    write_dos_partition_table(blank_disk)  # not ours to format
    await client.submit(disk_job("p1", busybox_image, [blank_disk], "true"))
    refused = await client.wait("p1", timeout=60)
    assert refused.status.value == "failed"
    assert "partition table" in (refused.termination_message or "")
    assert fs_type(blank_disk) == ""  # left untouched
    ours = f"dstack-{agent.agent_id[:8]}-p1-disk0"  # the agent's name for it (no other's)
    assert [v for v in docker_client.volumes.list() if v.name == ours] == []
