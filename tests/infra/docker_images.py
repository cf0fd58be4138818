"""Local test images, built with `docker import` from files on this machine (never pulled)."""

from __future__ import annotations

import fcntl
import io
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

BUSYBOX_IMAGE = "dstack-plan-test/busybox:latest"
BUSYBOX_BINARY = Path("/bin/busybox")
_LOCK = Path("/tmp/dstack-plan-test-images.lock")


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = int(time.time())
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def busybox_rootfs_tar(busybox: Path = BUSYBOX_BINARY) -> bytes:
    """A root filesystem: static busybox, a symlink per applet, /etc/passwd, empty system dirs."""
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("bin", "etc", "dev", "proc", "sys", "root"):
            _add_dir(tar, directory)
        _add_dir(tar, "tmp", 0o1777)
        _add_file(tar, "bin/busybox", busybox.read_bytes(), 0o755)
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type = tarfile.SYMTYPE
                link.linkname = "busybox"
                tar.addfile(link)
        _add_file(
            tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
        )
        _add_file(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    return buffer.getvalue()


def ensure_busybox_image(client: Any = None, name: str = BUSYBOX_IMAGE) -> str:
    """Build `name` from /bin/busybox unless it exists; returns the image name. Idempotent."""
    import docker  # noqa: PLC0415

    client = client or docker.from_env()
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test processes build it once
        try:
            client.images.get(name)
            return name
        except docker.errors.ImageNotFound:
            pass
        repository, _, tag = name.rpartition(":")
        client.api.import_image_from_data(
            busybox_rootfs_tar(),
            repository=repository,
            tag=tag,
            changes=["ENV PATH=/bin", 'CMD ["/bin/sh"]'],
        )
        client.images.get(name)
    return name
