"""`dstack top` on a terminal: the table is redrawn in place until Ctrl-C, which exits 0.

Runs on this machine's `local` fleet (no SSH fleet in state), under a pseudo-terminal.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

from tests.e2e.conftest import CLI

CURSOR_UP = b"\x1b[1A"


def read_until(fd: int, done: bytes, count: int, timeout: float) -> bytes:
    """What the terminal shows until `done` has appeared `count` times (or `timeout`)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while seen.count(done) < count and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the process closed the terminal
                break
    return seen


def test_top_on_a_terminal_redraws_in_place_and_ctrl_c_exits_0(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [*CLI, "top", "--interval", "0.2"],
        cwd=project,
        env=cli_env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    try:
        shown = read_until(leader, b"NODE", count=3, timeout=60)
        assert shown.count(b"NODE") >= 3, shown.decode(errors="replace")
        assert CURSOR_UP in shown  # each frame replaces the one before, not appended below
        assert b"local" in shown and b"Ctrl-C to quit" in shown
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        rest = read_until(leader, b"\0", count=1, timeout=1)
        assert b"Traceback" not in shown + rest and b"Interrupted" not in shown + rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
