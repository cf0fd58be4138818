"""Waiting for a process job's exit on a pidfd (`agent/runtimes/child_exit.py`): the status
is the child's, and the pidfds stay within their share of the open-files limit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from dstack_plan.agent.runtimes.child_exit import Pidfds, wait_exit


def test_the_exit_status_comes_through_the_pidfd() -> None:
    pidfds = Pidfds()
    proc = subprocess.Popen(["sh", "-c", "exit 7"])
    fd = pidfds.open(proc.pid)
    assert fd is not None
    try:
        assert wait_exit(proc, fd) == 7
    finally:
        pidfds.close(fd)
    killed = subprocess.Popen(["sleep", "60"])
    fd = pidfds.open(killed.pid)
    killed.kill()
    try:
        assert wait_exit(killed, fd) == -9
    finally:
        pidfds.close(fd)


def test_pidfds_take_at_most_a_quarter_of_the_open_files_limit() -> None:
    # In a process of its own: the limit is lowered for it alone.
    script = textwrap.dedent(
        """
        import resource, subprocess
        from dstack_plan.agent.runtimes.child_exit import Pidfds, wait_exit
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        pidfds = Pidfds()
        procs = [subprocess.Popen(["sh", "-c", f"exit {i}"]) for i in range(20)]
        fds = [pidfds.open(p.pid) for p in procs]
        print(sum(fd is not None for fd in fds))
        print([wait_exit(p, fd) for p, fd in zip(procs, fds)])
        for fd in fds:
            pidfds.close(fd)
        late = subprocess.Popen(["true"])
        fd = pidfds.open(late.pid)  # the share is free again
        print(fd is not None, wait_exit(late, fd))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    held, codes, late = out.stdout.splitlines()
    assert held == "16"  # 64 // 4
    assert codes == str(list(range(20)))  # with a pidfd or without, each its own status
    assert late == "True 0"
