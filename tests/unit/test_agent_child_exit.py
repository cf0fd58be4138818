"""Waiting for a process job's exit (`agent/runtimes/child_exit.py`): on a pidfd, or past
the pidfds' share of the open-files limit, for the end of its output while polling; the
status is the child's either way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

from dstack_plan.agent.runtimes.child_exit import Pidfds, wait_exit


def test_the_exit_status_comes_through_the_pidfd() -> None:
    pidfds = Pidfds()
    proc = subprocess.Popen(["sh", "-c", "exit 7"])
    fd = pidfds.open(proc.pid)
    assert fd is not None
    try:
        assert wait_exit(proc, fd, threading.Event()) == 7
    finally:
        pidfds.close(fd)
    killed = subprocess.Popen(["sleep", "60"])
    fd = pidfds.open(killed.pid)
    killed.kill()
    try:
        assert wait_exit(killed, fd, threading.Event()) == -9
    finally:
        pidfds.close(fd)


def test_pidfds_take_at_most_a_quarter_of_the_open_files_limit() -> None:
    # In a process of its own: the limit is lowered for it alone.
    script = textwrap.dedent(
        """
        import resource, subprocess
        import threading
        from dstack_plan.agent.runtimes.child_exit import Pidfds, wait_exit
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        pidfds = Pidfds()
        procs = [subprocess.Popen(["sh", "-c", f"exit {i}"]) for i in range(20)]
        fds = [pidfds.open(p.pid) for p in procs]
        print(sum(fd is not None for fd in fds))
        print([wait_exit(p, fd, threading.Event()) for p, fd in zip(procs, fds)])
        for fd in fds:
            pidfds.close(fd)
        late = subprocess.Popen(["true"])
        fd = pidfds.open(late.pid)  # the share is free again
        print(fd is not None, wait_exit(late, fd, threading.Event()))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    held, codes, late = out.stdout.splitlines()
    assert held == "16"  # 64 // 4
    assert codes == str(list(range(20)))  # with a pidfd or without, each its own status
    assert late == "True 0"


def test_without_a_pidfd_the_exit_is_found_whoever_holds_the_output() -> None:
    # the usual end: the output ends as the process exits
    proc = subprocess.Popen(["sh", "-c", "echo out; exit 5"], stdout=subprocess.PIPE)
    ended = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        proc.stdout.read()
        ended.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert wait_exit(proc, None, ended) == 5
    reader.join()
    # a process it left behind keeps the output open: its status is polled meanwhile
    lingering = subprocess.Popen(
        ["sh", "-c", "sleep 60 & exit 3"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert wait_exit(lingering, None, threading.Event()) == 3
    finally:
        os.killpg(lingering.pid, signal.SIGKILL)
        assert lingering.stdout is not None
        lingering.stdout.close()
