"""Is an agent serving a data dir, and where? Cheap checks, importing nothing heavy.

The serving process holds an exclusive lock on the data dir's serve lock for its whole life;
the kernel drops it when the process dies, even by SIGKILL, so the answer is never stale.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Any

from dstack_plan.agent.datadir import DataDir, read_json


def try_lock(path: Any) -> int | None:
    """An fd holding an exclusive lock on `path`, or None if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def read_pid(data: DataDir) -> int | None:
    try:
        return int(data.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def is_running(data: DataDir) -> bool:
    """Whether a `serve` process holds this data dir."""
    if not data.serve_lock.exists():
        return False
    fd = try_lock(data.serve_lock)
    if fd is None:
        return True
    os.close(fd)
    return False


def connection_info(data: DataDir, wait: float = 0.0) -> dict[str, Any] | None:
    """The running agent's connection info (waiting up to `wait` s while it starts), or None."""
    deadline = time.monotonic() + wait
    while True:
        if not is_running(data):
            return None
        pid = read_pid(data)
        try:
            info = read_json(data.connection_file)
            if info.get("pid") == pid:
                return info
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
