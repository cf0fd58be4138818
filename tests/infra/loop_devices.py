"""Blank block devices for tests of network volumes: a sparse file behind a loop device, as
a freshly attached cloud disk is, and the udev link a cloud image would make for it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LoopUnavailable(Exception):
    """This machine cannot make loop devices (not root, no /dev/loop-control)."""


@contextmanager
def loop_device(backing: Path, size_mb: int = 64) -> Iterator[str]:
    """A blank loop device of `size_mb` backed by the file `backing`; detached on exit."""
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        raise LoopUnavailable("loop devices need root and /dev/loop-control")
    with backing.open("wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    made = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], capture_output=True, text=True
    )
    if made.returncode != 0:
        raise LoopUnavailable(f"losetup: {made.stderr.strip()}")
    device = made.stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "--detach", device], capture_output=True)


@contextmanager
def udev_link(link: str, device: str) -> Iterator[str]:
    """`link` (`/dev/disk/by-id/...`) pointing at `device`, removed on exit."""
    path = Path(link)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(device)
    try:
        yield link
    finally:
        path.unlink(missing_ok=True)
