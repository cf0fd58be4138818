"""Processes as /proc tells them: a pid with its start time names one process (pids are
reused), and the processes below one."""

from __future__ import annotations

import os


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count after the last ')'
    return stat[stat.rfind(b")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; with the pid, it names one process."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def is_running(pid: int, start_ticks: int | None) -> bool:
    """Whether the process `pid` that started at `start_ticks` still runs (not exited, not a
    zombie waiting to be reaped, not another process that got its pid)."""
    fields = _stat_fields(pid)
    if fields is None or not fields or fields[0] == b"Z":
        return False
    try:
        return start_ticks is not None and int(fields[19]) == start_ticks
    except (IndexError, ValueError):
        return False


def descendants(root: int) -> list[int]:
    """The pids below `root` in the process tree now (children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        try:
            ppid = int(fields[1]) if fields is not None else None
        except (IndexError, ValueError):
            continue
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
