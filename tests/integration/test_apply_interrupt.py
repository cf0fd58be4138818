"""Ctrl-C during a real apply process: once finishes what runs and saves state, twice aborts.

The child is a small script driving the engine with a LocalBackend and a handler that sleeps,
with the engine's signal handlers installed as the CLI installs them.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.state import parse_state
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from dstack_plan.apply.engine import apply_plan
    from dstack_plan.apply.handlers import ApplyContext, Outcome, ResourceHandler
    from dstack_plan.apply.interrupt import Interrupt
    from dstack_plan.plan.model import Action, Plan, ResourceChange
    from dstack_plan.state import LocalBackend

    state_path, report_path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])

    class Sleepy(ResourceHandler):
        async def create(self, change, ctx):
            print("started", change.address, flush=True)
            await asyncio.sleep(seconds)
            return Outcome(status="running", attributes={"slept": seconds})

        async def update(self, change, current, ctx):
            raise NotImplementedError

        async def delete(self, current, ctx):
            return None

    def change(name):
        return ResourceChange(
            address=f"task.{name}", kind="task", name=name, provider="local",
            action=Action.CREATE, after={"name": name},
        )

    async def main():
        plan = Plan(lineage="", serial=0, changes=tuple(change(n) for n in "abcd"))
        interrupt = Interrupt()
        def events(address, phase, message):
            print("event", phase, address, message, flush=True)
        with interrupt.signal_handlers():
            report = await apply_plan(
                plan, LocalBackend(state_path), {"task": Sleepy()}, ApplyContext(),
                parallelism=2, interrupt=interrupt, on_event=events,
            )
        with open(report_path, "w") as f:
            f.write(report.model_dump_json())
        print(report.summary(), flush=True)
        return 0 if report.ok else 3

    sys.exit(asyncio.run(main()))
    """
)


class Child:
    """The apply script as a process, with its stdout read line by line in the background."""

    def __init__(self, tmp_path: Path, seconds: float) -> None:
        script = tmp_path / "apply_script.py"
        script.write_text(SCRIPT)
        self.state_path = tmp_path / "state.json"
        self.report_path = tmp_path / "report.json"
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(self.state_path),
                str(self.report_path),
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for_lines(self, *wanted: str, timeout: float = 20.0) -> None:
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

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        time.sleep(0.05)  # let the reader thread drain the pipe
        while not self.lines.empty():
            self.output.append(self.lines.get())
        return code

    def report(self) -> dict[str, Any]:
        return {r["address"]: r for r in json.loads(self.report_path.read_text())["results"]}


def test_one_sigint_finishes_operations_in_progress_and_saves_state(tmp_path: Path) -> None:
    child = Child(tmp_path, seconds=1.0)
    child.wait_for_lines("started task.a", "started task.b")
    child.proc.send_signal(signal.SIGINT)

    assert child.finish(timeout=15) == 3, child.output
    report = child.report()
    assert report["task.a"]["status"] == report["task.b"]["status"] == "succeeded"
    assert report["task.c"]["status"] == report["task.d"]["status"] == "not-started"
    assert any(line.startswith("event interrupt  Interrupt received") for line in child.output)
    assert "started task.c" not in child.output
    state = parse_state(child.state_path.read_text(), str(child.state_path))
    assert set(state.resources) == {"task.a", "task.b"}
    assert all(not r.tainted and r.status == "running" for r in state.resources.values())


def test_two_sigints_abort_promptly_leaving_tainted_records(tmp_path: Path) -> None:
    child = Child(tmp_path, seconds=60)
    child.wait_for_lines("started task.a", "started task.b")
    began = time.monotonic()
    child.proc.send_signal(signal.SIGINT)
    child.wait_for_lines(
        "event interrupt  Interrupt received: finishing 2 operations in progress and starting "
        "nothing new; press Ctrl-C again to abort"
    )
    child.proc.send_signal(signal.SIGINT)

    assert child.finish(timeout=15) == 3, child.output
    assert time.monotonic() - began < 5
    report = child.report()
    assert report["task.a"]["status"] == report["task.b"]["status"] == "aborted"
    assert report["task.c"]["status"] == "not-started"
    state = parse_state(child.state_path.read_text(), str(child.state_path))
    assert set(state.resources) == {"task.a", "task.b"}
    assert all(r.tainted and r.status == "creating" for r in state.resources.values())
