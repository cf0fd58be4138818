"""Whether the process that wrote a record (a lock, watch's lease) is still running.

A record names its writer's pid, the PID space it ran in (this boot of this machine and its
PID namespace) and the process's start time. Only a process in the same PID space may judge
from the pid: there, a pid that no longer runs, or that runs a process started at another
time (the pid was reused by another program), means the writer is gone, so its record need
not be waited out. From anywhere else (another machine, another container) nothing can be
told, and the record's lease decides.
"""

from __future__ import annotations

import os
from pathlib import Path


def pid_space() -> str | None:
    """This process's PID space: the boot id and the PID namespace, or None where they
    cannot be read. A hostname is not enough: cloned machines share one, and containers on
    one host share the boot but not their process ids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}:{namespace}"


def _stat(pid: int) -> list[bytes] | None:
    """The fields of `/proc/PID/stat` from the third (the state) on; None if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or parentheses itself
    return stat[stat.rfind(b")") + 2 :].split()


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, `/proc/PID/stat` field 22), or
    None when it does not run or this cannot be read."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def this_process() -> tuple[int, str | None, int | None]:
    """(pid, PID space, start time) of this process, as records store them."""
    pid = os.getpid()
    return pid, pid_space(), process_start(pid)


def process_gone(pid: int | None, space: str | None, started: int | None) -> bool:
    """True when the process a record names is known to be gone: it ran in this PID space,
    is not this process, and its pid no longer runs or runs a process started at another
    time. False whenever that cannot be told (another machine, no pid, no /proc)."""
    if pid is None or space is None or pid == os.getpid() or space != pid_space():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # it exists (another user's process): look at its start time
    fields = _stat(pid)
    if fields is None:
        return False
    if fields[:1] in ([b"Z"], [b"X"]):
        return True  # killed, and not reaped yet by its parent
    try:
        now_started = int(fields[19])
    except (IndexError, ValueError):
        return False
    return started is not None and now_started != started
