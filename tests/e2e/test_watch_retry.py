"""`dstack watch` carries out the retry policy with a real local agent: a job that fails only
the first time is retried and then succeeds; without `retry` it stays failed. On both state
backends."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from dstack_plan.watch.metrics import WatchMetrics
from dstack_plan.watch.model import TickReport
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES

# watch's lease, event log and commits, once per state backend (local file, S3 on moto)
pytestmark = pytest.mark.usefixtures("state_backend")


def flaky(marker: Path, retry: str) -> str:
    command = f"test -f {marker} || {{ touch {marker}; exit 3; }}; echo second try"
    return f"type: task\nname: flaky\ncommands: [{json.dumps(command)}]\n{retry}{RESOURCES}"


async def _tick_and_close(watcher: Watcher) -> TickReport:
    try:
        return await watcher.tick()
    finally:
        await watcher.project.close()


@pytest.mark.parametrize("retry", [True, False])
def test_a_job_failing_once_is_retried_only_when_the_run_says_so(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, retry: bool
) -> None:
    project = tmp_path / "project"
    marker = tmp_path / "failed-once"
    policy = "retry: {on_events: [error], duration: 1m}\n" if retry else ""
    (project / "flaky.dstack.yml").write_text(flaky(marker, policy))
    assert dstack("apply", "-y").returncode == 0
    failed = wait_for_status(dstack, "task.flaky", {"failed"})
    first = state(project)["resources"]["task.flaky"]["attributes"]["jobs"][0]["id"]

    # watch's first look a second after the failure, on its clock: a loaded machine may take
    # longer than the backoff to start a `watch --once`, which would then place it at once
    ended = datetime.fromisoformat(failed["jobs"][0]["finished_at"]).timestamp()
    metrics = tmp_path / "watch.prom"
    exported_by = WatchMetrics()
    looking = Project(project, agent_dir=agent_dir, clock=FakeClock(ended + 1))
    events = EventLog(looking.backend, secret_guard=looking.guard)  # as `dstack watch` does
    exported_by.observe(asyncio.run(_tick_and_close(Watcher(looking, events=events))))
    exported_by.write_file(metrics)
    entry = state(project)["resources"]["task.flaky"]
    if retry:
        # back to pending: placed again after the first backoff step (15 s), on watch's clock
        assert entry["attributes"]["jobs"][0]["id"] == first
        waiting = entry["attributes"]["retry"]["next_attempt_at"]
        assert waiting - entry["attributes"]["retry"]["last_failure_at"] == 15
        # waiting for its retry, the run is pending (as dstack says), in state and in ps
        assert entry["status"] == "pending"
        [row] = json.loads(dstack("ps", "--json").stdout)
        assert row["status"] == "pending"
        # a dashboard sees it waiting, not failed: queue depth 1, no failed run
        exported = metrics.read_text()
        assert "dstack_task_queue_depth 1.0" in exported, exported
        assert 'dstack_runs{status="failed"} 0.0' in exported, exported
        assert 'dstack_runs{status="pending"} 1.0' in exported, exported
        assert [n.split(" at ")[0] for n in row["notes"]] == ["retrying"]
        later = FakeClock(time.time() + 16)
        watcher = Watcher(Project(project, agent_dir=agent_dir, clock=later))
        asyncio.run(_tick_and_close(watcher))
        entry = state(project)["resources"]["task.flaky"]
        assert entry["attributes"]["retry"]["attempts"] == 1
        assert entry["attributes"]["jobs"][0]["id"] != first  # submitted again
        row = wait_for_status(dstack, "task.flaky", {"done"})
        assert row["jobs"][0]["exit_code"] == 0
        assert dstack("logs", "flaky").stdout == "second try\n"
        assert dstack("watch", "--once").returncode == 0  # the second attempt's events too
    else:
        assert entry["status"] == "failed"
        assert entry["attributes"]["jobs"][0]["id"] == first  # never retried
        assert dstack("watch", "--once").returncode == 0
        assert state(project)["resources"]["task.flaky"]["attributes"]["jobs"][0]["id"] == first
    events = dstack("events", "--json")
    assert events.returncode == 0, events.stderr
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert any(e["address"] == "task.flaky" and e["new_status"] == "failed" for e in lines)
    runs = [(e["old_status"], e["new_status"]) for e in lines if e["kind"] == "run"]
    if retry:  # never `failed` on the way: pending while it waits, then done
        assert any(new == "pending" for _, new in runs), runs
        assert runs[-1][1] == "done" and all(new != "failed" for _, new in runs), runs
    # every event says why: the job's exit, and (without retry) the run's end
    (exited,) = [e for e in lines if e["kind"] == "job" and e["new_status"] == "failed"]
    assert exited["reason"] == "container_exited_with_error: exited with code 3", exited
    if not retry:
        (ended,) = [e for e in lines if e["kind"] == "run" and e["new_status"] == "failed"]
        assert ended["reason"] == "job_failed", ended
    assert len({e["span_id"] for e in lines if e["address"] == "task.flaky"}) == 1
    assert dstack("destroy", "-y").returncode == 0
