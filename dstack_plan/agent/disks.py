"""Network disks in a job's container: the device the controller attached, formatted on
first use, mounted by Docker.

Docker does the mounting (a `local` volume of type ext4 on the device), not the agent: the
mount then lives in the engine's mount namespace, the one the container sees, and the engine
releases it when the container stops, so the disk can be detached as soon as the job ends.
The agent only finds the device (udev may add its link a moment after the attach) and makes
a filesystem on a blank one. A device that already has a filesystem is never formatted; one
with a partition table and no filesystem is refused rather than overwritten.

Runs with python3 and the docker SDK only, as the rest of the agent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from dstack_plan.agent.spec import DiskSpec

DEVICE_WAIT_S = 60.0
"""How long the device may take to appear after the attach (udev, the hypervisor)."""
FILESYSTEM = "ext4"
_TOOL_DIRS = "/usr/sbin:/sbin:/usr/bin:/bin"


class DiskError(Exception):
    """The disk cannot be used: no device appeared, it cannot be read or formatted."""


def find_device(
    disk: DiskSpec,
    wait: float = DEVICE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """The real path of the first of the disk's devices that exists, waiting `wait` seconds
    for one to appear."""
    deadline = clock() + wait
    while True:
        for device in disk.devices:
            if os.path.exists(device):
                return os.path.realpath(device)
        if clock() >= deadline:
            raise DiskError(
                f"volume {disk.name}: no device appeared within {wait:g}s "
                f"(looked for {', '.join(disk.devices)})"
            )
        sleep(0.5)


def probe(device: str) -> dict[str, str]:
    """What blkid finds on `device` (`TYPE`, `PTTYPE`, ...); empty when it is blank."""
    done = _run(["blkid", "-p", "-o", "export", device])
    if done.returncode == 2:  # nothing recognised: a blank device
        return {}
    if done.returncode != 0:
        raise DiskError(f"cannot read {device}: {_said(done)}")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def prepare(disk: DiskSpec) -> tuple[str, str]:
    """The disk's device and filesystem type, after making a filesystem on a blank one."""
    device = find_device(disk)
    found = probe(device)
    if found.get("TYPE"):
        return device, found["TYPE"]
    if found.get("PTTYPE"):
        raise DiskError(
            f"volume {disk.name}: {device} has a {found['PTTYPE']} partition table and no "
            "filesystem; not formatting it"
        )
    if disk.read_only:
        raise DiskError(f"volume {disk.name}: {device} is blank and mounted read-only")
    done = _run([f"mkfs.{FILESYSTEM}", "-q", device])
    if done.returncode != 0:
        raise DiskError(f"volume {disk.name}: cannot format {device}: {_said(done)}")
    return device, FILESYSTEM


def disk_mount(disk: DiskSpec, volume_name: str, device: str, fstype: str) -> Any:
    """The container mount of `disk`: a Docker volume `volume_name` on `device`."""
    import docker.types  # noqa: PLC0415

    return docker.types.Mount(
        disk.container_path,
        volume_name,
        type="volume",
        read_only=disk.read_only,
        driver_config=docker.types.DriverConfig("local", {"type": fstype, "device": device}),
    )


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    tool = shutil.which(argv[0], path=f"{os.environ.get('PATH', '')}:{_TOOL_DIRS}")
    if tool is None:
        raise DiskError(f"{argv[0]} is not installed on this machine")
    command = [tool, *argv[1:]]
    if os.geteuid() != 0:  # devices are root's; an agent run as a user asks sudo
        command = ["sudo", "-n", *command]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DiskError(f"{argv[0]}: {e}") from e


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
