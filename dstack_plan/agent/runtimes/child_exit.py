"""Waiting for one child process to exit without joining every waiter's queue.

A thread blocked in `waitpid(pid)` sleeps on its process's one queue of child-exit waiters,
and each child's exit walks that whole queue, under the kernel's task-list lock, to find whom
to wake: with a thread waiting so for each of 10,000 process jobs, every exit took 10,000
steps while every fork, exit and wait on the machine queued for that lock, and stopping them
all was quadratic. A pidfd (Linux 5.3, Python 3.9) has a queue of its own: the thread sleeps
on it until its child has exited, then reaps it at once.

A pidfd is an open file, and a job already holds one (its output pipe): where the open-files
limit is low (a container's 20,000), pidfds for all would halve the jobs a host can start.
They take at most a quarter of the limit; the jobs past that wait in `waitpid` as before.
"""

from __future__ import annotations

import os
import resource
import select
import subprocess
import threading

PIDFD_SHARE = 4
"""Pidfds are at most 1/PIDFD_SHARE of the open-files limit."""


class Pidfds:
    """The pidfds of one runtime's children, within their share of the open-files limit."""

    def __init__(self) -> None:
        self._held = 0
        self._lock = threading.Lock()

    def open(self, pid: int) -> int | None:
        """A pidfd of child `pid`, to open before anything can reap it; None past the share,
        or where the kernel or this Python has none (`wait_exit` then uses `waitpid`)."""
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        with self._lock:
            if limit != resource.RLIM_INFINITY and self._held >= limit // PIDFD_SHARE:
                return None
            try:
                fd = os.pidfd_open(pid)
            except (AttributeError, OSError):
                return None
            self._held += 1
            return fd

    def close(self, fd: int | None) -> None:
        """Close a pidfd `open` returned (None is nothing to close)."""
        if fd is None:
            return
        os.close(fd)
        with self._lock:
            self._held -= 1


def wait_exit(proc: subprocess.Popen[bytes], pidfd: int | None) -> int:
    """`proc`'s exit status, once it has exited: waited for on `pidfd` where there is one."""
    if pidfd is not None:
        poller = select.poll()  # not select(): the agent's descriptors go past 1,024
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():  # no timeout: it returns with the exit (EINTR is retried)
            pass
    return proc.wait()
