"""`dstack watch` places queued runs and starts scheduled ones, with a real local agent and a
fake clock on the Watcher's project: a run that cannot fit while another holds the machine's
port is applied as pending and placed once the holder ends, or fails after its retry
duration; a scheduled task starts only when its cron fires, returns to pending after it ends,
and once stopped is never started again."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES

PORT = 18931


def port_task(name: str, command: str, extra: str = "") -> str:
    """A process task that binds `PORT` on the host (so two of them cannot run at once)."""
    return (
        f"type: task\nname: {name}\ncommands: [{json.dumps(command)}]\nports: [{PORT}]\n"
        f"stop_duration: 1s\n{extra}{RESOURCES}"
    )


def tick(project: Path, agent_dir: Path, at: float) -> None:
    async def run() -> None:
        watcher = Watcher(Project(project, agent_dir=agent_dir, clock=FakeClock(at)))
        try:
            await watcher.tick()
        finally:
            await watcher.project.close()

    asyncio.run(run())


def entry(project: Path, address: str) -> dict:
    return state(project)["resources"][address]


def queue_behind_holder(dstack: Dstack, project: Path, marker: Path, duration: str) -> float:
    """Apply a task holding the port until `marker` exists, then one that waits for it;
    when the waiter was queued."""
    hold = f"while [ ! -f {marker} ]; do sleep 0.1; done"
    (project / "hold.dstack.yml").write_text(port_task("hold", hold))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.hold", {"running"})
    retry = f"retry: {{on_events: [no-capacity], duration: {duration}}}\n"
    (project / "waiter.dstack.yml").write_text(port_task("waiter", "echo placed", retry))
    planned = dstack("plan")
    note = f"queued: dstack watch places it when room frees (retry on no-capacity for {duration}"
    assert planned.returncode == 0 and "pending: waits for port" in planned.stdout, planned
    assert note in planned.stdout
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert note in applied.stdout and "task.waiter: Creation complete" in applied.stdout
    waiter = entry(project, "task.waiter")
    assert waiter["status"] == "pending" and waiter["attributes"]["jobs"] == []
    queued = waiter["attributes"]["queued"]
    assert "waits for port" in queued["why"]
    return float(queued["since"])


def test_a_queued_run_is_placed_when_the_run_holding_its_port_ends(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    marker = tmp_path / "release"
    since = queue_behind_holder(dstack, project, marker, "1m")

    tick(project, agent_dir, since + 1)  # the holder runs: the waiter waits out its backoff
    waiter = entry(project, "task.waiter")
    assert waiter["status"] == "pending" and waiter["attributes"]["jobs"] == []
    assert waiter["attributes"]["retry"]["next_attempt_at"] == since + 15

    marker.touch()
    wait_for_status(dstack, "task.hold", {"done"})
    tick(project, agent_dir, since + 2)  # room freed: placed at once, before the backoff
    waiter = entry(project, "task.waiter")
    assert "queued" not in waiter["attributes"] and len(waiter["attributes"]["jobs"]) == 1
    assert waiter["attributes"]["retry"].get("attempts", 0) == 0  # the ladder starts over
    wait_for_status(dstack, "task.waiter", {"done"})
    assert dstack("logs", "waiter").stdout == "placed\n"
    assert dstack("destroy", "-y").returncode == 0


def test_a_queued_run_fails_after_its_retry_duration_when_room_never_comes(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    marker = tmp_path / "never"
    since = queue_behind_holder(dstack, project, marker, "1m")

    tick(project, agent_dir, since + 16)  # first backoff step over: tried, no room
    waiter = entry(project, "task.waiter")
    assert waiter["status"] == "pending" and waiter["attributes"]["jobs"] == []
    assert waiter["attributes"]["queued"]["attempted_at"] == since + 16
    assert waiter["attributes"]["queued"]["since"] == since
    assert waiter["attributes"]["retry"]["attempts"] == 1
    assert waiter["attributes"]["retry"]["next_attempt_at"] == since + 16 + 30

    tick(project, agent_dir, since + 61)
    waiter = entry(project, "task.waiter")
    assert waiter["status"] == "failed" and waiter["attributes"]["jobs"] == []
    assert waiter["attributes"]["termination_reason"] == "retry_limit_exceeded"
    tick(project, agent_dir, since + 700)  # given up: never placed again
    assert entry(project, "task.waiter")["attributes"]["jobs"] == []
    marker.touch()
    assert dstack("destroy", "-y").returncode == 0


def test_a_scheduled_task_runs_when_its_cron_fires_and_not_after_a_stop(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    (project / "nightly.dstack.yml").write_text(
        "type: task\nname: nightly\ncommands: ['echo fired']\n"
        f"schedule: {{cron: '0 * * * *'}}\n{RESOURCES}"
    )
    planned = dstack("plan")
    assert "scheduled: dstack watch starts it when its cron fires, next at" in planned.stdout
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "scheduled: dstack watch starts it when its cron fires" in applied.stdout
    nightly = entry(project, "task.nightly")
    assert nightly["status"] == "pending" and nightly["attributes"]["jobs"] == []
    first = nightly["attributes"]["schedule"]["next_run_at"]
    assert nightly["attributes"]["schedule"]["last_run_at"] is None
    assert first % 3600 == 0 and time.time() < first <= time.time() + 3600
    assert dstack("plan", "--detailed-exitcode").returncode == 0  # pending is what it is

    tick(project, agent_dir, first - 1)
    assert entry(project, "task.nightly")["attributes"]["jobs"] == []  # not yet
    tick(project, agent_dir, first + 1)
    nightly = entry(project, "task.nightly")
    assert len(nightly["attributes"]["jobs"]) == 1
    assert nightly["attributes"]["schedule"] == {
        "next_run_at": first + 3600,
        "last_run_at": first + 1,
    }
    wait_for_status(dstack, "task.nightly", {"done"})
    assert dstack("logs", "nightly").stdout == "fired\n"

    tick(project, agent_dir, first + 2)  # its job is over: back to pending, for the next hour
    nightly = entry(project, "task.nightly")
    assert nightly["status"] == "pending" and nightly["attributes"]["jobs"] == []
    assert nightly["attributes"]["schedule"]["next_run_at"] == first + 3600

    stopped = dstack("stop", "nightly", "-y")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    nightly = entry(project, "task.nightly")
    assert nightly["status"] == "terminated"
    assert nightly["attributes"]["termination_reason"] == "stopped_by_user"
    tick(project, agent_dir, first + 3 * 3600 + 1)  # hours of fire times: never started
    nightly = entry(project, "task.nightly")
    assert nightly["status"] == "terminated" and nightly["attributes"]["jobs"] == []
    assert dstack("destroy", "-y").returncode == 0


def test_a_failed_run_that_finds_no_room_to_be_retried_is_queued(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    marker, release = tmp_path / "failed-once", tmp_path / "release"
    flaky = f"test -f {marker} || {{ touch {marker}; exit 3; }}; echo second try"
    retry = "retry: {duration: 1m}\n"  # every event, no-capacity included
    (project / "flaky.dstack.yml").write_text(port_task("flaky", flaky, retry))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.flaky", {"failed"})
    hold = f"while [ ! -f {release} ]; do sleep 0.1; done"
    (project / "hold.dstack.yml").write_text(port_task("hold", hold))
    assert dstack("apply", "-y", "--target", "task.hold").returncode == 0
    wait_for_status(dstack, "task.hold", {"running"})

    later = time.time() + 16
    tick(project, agent_dir, later)  # the retry's backoff is over, but hold has the port
    flaky_entry = entry(project, "task.flaky")
    assert flaky_entry["status"] == "pending" and flaky_entry["attributes"]["jobs"] == []
    assert "waits for port" in flaky_entry["attributes"]["queued"]["why"]
    assert flaky_entry["attributes"]["retry"]["next_attempt_at"] > later

    release.touch()
    wait_for_status(dstack, "task.hold", {"done"})
    tick(project, agent_dir, later + 1)  # room freed: placed at once
    wait_for_status(dstack, "task.flaky", {"done"})
    assert dstack("logs", "flaky").stdout == "second try\n"
    assert dstack("destroy", "-y").returncode == 0


def test_a_run_the_plan_finds_pending_behind_one_it_starts_is_queued_not_raced(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    (project / "hold.dstack.yml").write_text(port_task("hold", "exec sleep 300"))
    (project / "waiter.dstack.yml").write_text(port_task("waiter", "echo placed", "retry: true\n"))
    applied = dstack("apply", "-y")  # both new: the plan gives the port to the first
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (
        "waits for port" in applied.stdout and "queued: dstack watch places it" in applied.stdout
    )
    waiter = entry(project, "task.waiter")
    assert waiter["status"] == "pending" and waiter["attributes"]["jobs"] == []
    assert "; queued:" not in waiter["attributes"]["queued"]["why"]
    assert len(entry(project, "task.hold")["attributes"]["jobs"]) == 1
    assert len(list((agent_dir / "jobs").iterdir())) == 1
    stopped = dstack("stop", "waiter", "-y")  # a queued run stopped is never placed
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert entry(project, "task.waiter")["status"] == "terminated"
    assert dstack("stop", "hold", "-y").returncode == 0
    tick(project, agent_dir, time.time() + 700)
    waiter = entry(project, "task.waiter")
    assert waiter["status"] == "terminated" and waiter["attributes"]["jobs"] == []
    assert dstack("destroy", "-y").returncode == 0
