"""Watching a process job on a pidfd (`agent/runtimes/child_exit.py`): its output comes
through whole, its status is the child's, a process that escaped its group holding the pipe
does not keep the watcher, and the pidfds stay within their share of the open-files limit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from dstack_plan.agent.runtimes.child_exit import Pidfds, drain, pump_until_exit


def _watch(proc: subprocess.Popen[bytes], fd: int | None) -> tuple[int, bytes]:
    """As the process runtime does: output pumped until the exit, then drained."""
    assert fd is not None and proc.stdout is not None
    out: list[bytes] = []
    if pump_until_exit(fd, proc.stdout.fileno(), out.append):
        assert drain(proc.stdout.fileno(), out.append, 60.0)
    proc.stdout.close()
    return proc.wait(), b"".join(out)


def test_the_exit_status_comes_through_the_pidfd() -> None:
    pidfds = Pidfds()
    # more output than a pipe holds, some of it written just before the exit
    script = "head -c 300000 /dev/zero | tr '\\0' x; echo; echo last; exit 7"
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE)
    fd = pidfds.open(proc.pid)
    try:
        code, out = _watch(proc, fd)
    finally:
        pidfds.close(fd)
    assert code == 7
    assert out == b"x" * 300000 + b"\nlast\n"
    killed = subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE)
    fd = pidfds.open(killed.pid)
    killed.kill()
    try:
        assert _watch(killed, fd) == (-9, b"")
    finally:
        pidfds.close(fd)


def test_a_process_holding_the_pipe_past_the_exit_does_not_keep_the_watcher() -> None:
    # The job leaves a process in a session of its own that keeps the pipe open for an hour:
    # the watcher takes what was written before the exit and returns after its drain bound.
    script = "echo before; setsid sleep 3600 & echo $!; exit 3"
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE)
    pidfds = Pidfds()
    fd = pidfds.open(proc.pid)
    assert fd is not None and proc.stdout is not None
    out: list[bytes] = []
    try:
        assert pump_until_exit(fd, proc.stdout.fileno(), out.append)  # still held open
        assert not drain(proc.stdout.fileno(), out.append, seconds=0.2)  # not ended
        assert proc.wait() == 3
    finally:
        pidfds.close(fd)
        proc.stdout.close()
    before, escaped = b"".join(out).decode().split()
    os.kill(int(escaped), 9)
    assert before == "before"


def test_pidfds_take_at_most_a_quarter_of_the_open_files_limit() -> None:
    # In a process of its own: the limit is lowered for it alone.
    script = textwrap.dedent(
        """
        import resource, subprocess
        from dstack_plan.agent.runtimes.child_exit import Pidfds
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        pidfds = Pidfds()
        procs = [subprocess.Popen(["sh", "-c", f"exit {i}"]) for i in range(20)]
        fds = [pidfds.open(p.pid) for p in procs]
        print(sum(fd is not None for fd in fds))
        print([p.wait() for p in procs])
        for fd in fds:
            pidfds.close(fd)
        late = subprocess.Popen(["true"])
        fd = pidfds.open(late.pid)  # the share is free again
        print(fd is not None, late.wait())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    held, codes, late = out.stdout.splitlines()
    assert held == "16"  # 64 // 4
    assert codes == str(list(range(20)))  # a pidfd takes no child's status
    assert late == "True 0"
