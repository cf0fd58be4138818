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

With a pidfd, the job's one thread watches both its output pipe and its exit
(`pump_until_exit`): a thread a job, not a reader and a waiter each.
"""

from __future__ import annotations

import logging
import os
import resource
import select
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PIDFD_SHARE = 4
"""Pidfds are at most 1/PIDFD_SHARE of the open-files limit."""

_READ_SIZE = 64 * 1024


class Pidfds:
    """The pidfds of one runtime's children, within their share of the open-files limit."""

    def __init__(self) -> None:
        self._held = 0
        self._lock = threading.Lock()

    def open(self, pid: int) -> int | None:
        """A pidfd of child `pid`, to open before anything can reap it; None past the share,
        or where the kernel or this Python has none (the job's thread then waits in `waitpid`)."""
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


def pump_until_exit(pidfd: int, pipe: int, on_output: Callable[[bytes], None]) -> bool:
    """Pass what arrives on `pipe` to `on_output` until the child of `pidfd` has exited
    (output already waiting is passed first); whether the pipe is still open then."""
    poller = select.poll()  # not select(): the agent's descriptors go past 1,024
    poller.register(pidfd, select.POLLIN)
    poller.register(pipe, select.POLLIN)
    pipe_open = True
    while True:
        ready = {fd for fd, _ in poller.poll()}  # no timeout: EINTR is retried
        if pipe in ready and not _pass_on(pipe, on_output):
            poller.unregister(pipe)
            pipe_open = False
        if pidfd in ready:
            return pipe_open


def drain(pipe: int, on_output: Callable[[bytes], None], seconds: float) -> bool:
    """Pass what is left on `pipe` to `on_output` until its end, for at most `seconds`;
    whether the end came."""
    poller = select.poll()
    poller.register(pipe, select.POLLIN)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if poller.poll(left * 1000) and not _pass_on(pipe, on_output):
            return True
    return False


def read_to_end(pipe: int, on_output: Callable[[bytes], None]) -> None:
    """Pass everything that arrives on `pipe` to `on_output`, until its end (blocking)."""
    while _pass_on(pipe, on_output):
        pass


def _pass_on(pipe: int, on_output: Callable[[bytes], None]) -> bool:
    """One read of `pipe` passed to `on_output`; False at its end (or a read error)."""
    try:
        data = os.read(pipe, _READ_SIZE)
    except OSError as e:
        log.warning("reading a job's output failed: %s", e)
        return False
    if data:
        on_output(data)
    return bool(data)
