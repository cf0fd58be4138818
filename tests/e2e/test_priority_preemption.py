"""Within one project, a queued run of higher priority preempts a lower-priority run that
says it may be (`preemptible: true`), never one that does not: a real local agent seeing four
fake GPUs, watch on a fake clock ticked by hand."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_watch_quota import four_gpu_dstack  # noqa: F401 - fixture

WAIT = 90.0


def task(name: str, extra: str) -> str:
    return (
        f"type: task\nname: {name}\ncommands: ['exec sleep 300']\nstop_duration: 1s\n{extra}"
        "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: 2}\n"
    )


def test_a_higher_priority_run_preempts_only_a_preemptible_lower_one(
    four_gpu_dstack: Dstack,  # noqa: F811
    tmp_path: Path,
    agent_dir: Path,
) -> None:
    dstack = four_gpu_dstack
    project = tmp_path / "project"
    (project / "stiff.dstack.yml").write_text(task("stiff", "priority: 0\n"))
    (project / "low.dstack.yml").write_text(
        task("low", "priority: 10\npreemptible: true\nretry: {on_events: [interruption]}\n")
    )
    assert dstack("apply", "-y").returncode == 0
    for name in ("stiff", "low"):
        wait_for_status(dstack, f"task.{name}", {"running"})
    (project / "high.dstack.yml").write_text(
        task("high", "priority: 50\nretry: {on_events: [no-capacity], duration: 1h}\n")
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert state(project)["resources"]["task.high"]["status"] == "pending"

    clock = FakeClock(time.time())
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    watcher = Watcher(watched, events=EventLog(watched.backend))

    async def ticks() -> None:
        try:
            deadline = time.monotonic() + WAIT
            while state(project)["resources"]["task.high"]["status"] != "running":
                assert time.monotonic() < deadline, "task.high placed once task.low gave way"
                await watcher.tick()
                clock.advance(5)
                await asyncio.sleep(0.3)
        finally:
            await watched.close()

    asyncio.run(ticks())
    events = [json.loads(line) for line in dstack("events", "--json").stdout.splitlines()]
    # the stop for task.high, then the job's end as the agent reported it
    stop, ended = [e for e in events if (e["reason"] or "").startswith("preempted:")]
    assert stop["address"] == ended["address"] == "task.low"
    assert "task.high (priority 50) waits" in stop["reason"]
    assert ended["new_status"] == "terminated"
    resources = state(project)["resources"]
    assert resources["task.stiff"]["status"] == "running"  # not preemptible: never touched
    assert resources["task.low"]["status"] == "pending"  # retried, waits for room
    assert dstack("destroy", "-y").returncode == 0
