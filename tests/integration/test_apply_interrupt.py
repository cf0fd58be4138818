"""Ctrl-C during a real apply process: once finishes what runs and saves state, twice aborts.

The child is a small script driving the engine with a LocalBackend and a handler that waits
until the test lets it finish (a file appears), with the engine's signal handlers installed
as the CLI installs them.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.state import parse_state
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(300)
NET = 120.0
"""Seconds the test waits for the child before concluding it will not get there (a safety
net: passing never waits it out)."""
INTERRUPT_RECEIVED = (
    "event interrupt  Interrupt received: finishing 2 operations in progress and starting "
    "nothing new; press Ctrl-C again to abort"
)

APPLY_SCRIPT = REPO_ROOT / "tests" / "infra" / "apply_until_released.py"


class Child:
    """The apply script as a process, with its stdout read line by line in the background."""

    def __init__(self, tmp_path: Path) -> None:
        self.state_path = tmp_path / "state.json"
        self.report_path = tmp_path / "report.json"
        self.release_path = tmp_path / "release"
        """Once it exists, the creates in progress finish."""
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(APPLY_SCRIPT),
                str(self.state_path),
                str(self.report_path),
                str(self.release_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for_lines(self, *wanted: str, timeout: float = NET) -> None:
        missing = set(wanted)
        deadline = time.monotonic() + timeout
        while missing:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                pytest.fail(f"never saw {sorted(missing)}; output so far: {self.output}")
            self.output.append(line)
            missing.discard(line)

    def finish(self, timeout: float = NET) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout)  # it ends at the end of the pipe: all lines are in
        while not self.lines.empty():
            self.output.append(self.lines.get())
        return code

    def report(self) -> dict[str, Any]:
        return {r["address"]: r for r in json.loads(self.report_path.read_text())["results"]}


def test_one_sigint_finishes_operations_in_progress_and_saves_state(tmp_path: Path) -> None:
    child = Child(tmp_path)
    child.wait_for_lines("started task.a", "started task.b")
    child.proc.send_signal(signal.SIGINT)
    child.wait_for_lines(INTERRUPT_RECEIVED)
    child.release_path.touch()  # the creates in progress may finish now, and nothing else

    assert child.finish() == 3, child.output
    report = child.report()
    assert report["task.a"]["status"] == report["task.b"]["status"] == "succeeded"
    assert report["task.c"]["status"] == report["task.d"]["status"] == "not-started"
    assert "started task.c" not in child.output
    state = parse_state(child.state_path.read_text(), str(child.state_path))
    assert set(state.resources) == {"task.a", "task.b"}
    assert all(not r.tainted and r.status == "running" for r in state.resources.values())


def test_two_sigints_abort_promptly_leaving_tainted_records(tmp_path: Path) -> None:
    child = Child(tmp_path)  # never released: its creates can only end by being cancelled
    child.wait_for_lines("started task.a", "started task.b")
    child.proc.send_signal(signal.SIGINT)
    child.wait_for_lines(INTERRUPT_RECEIVED)
    child.proc.send_signal(signal.SIGINT)

    # promptly: the apply ends without its creates ever finishing (they never would)
    assert child.finish() == 3, child.output
    assert not child.release_path.exists()
    report = child.report()
    assert report["task.a"]["status"] == report["task.b"]["status"] == "aborted"
    assert report["task.c"]["status"] == "not-started"
    state = parse_state(child.state_path.read_text(), str(child.state_path))
    assert set(state.resources) == {"task.a", "task.b"}
    assert all(r.tainted and r.status == "creating" for r in state.resources.values())
