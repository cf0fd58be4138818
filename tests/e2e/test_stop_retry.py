"""`dstack stop` on a run waiting for its retry cancels the retry: the run ends `terminated`
(stopped by the user), `ps` stops promising a next attempt, and no later watch tick
resubmits it."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_watch_retry import _tick_and_close

ALWAYS_FAILS = (
    'type: task\nname: flaky\ncommands: ["exit 3"]\n'
    "retry: {on_events: [error], duration: 1h}\n" + RESOURCES
)


def test_stopping_a_run_that_waits_for_its_retry_cancels_the_retry(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    (project / "flaky.dstack.yml").write_text(ALWAYS_FAILS)
    assert dstack("apply", "-y").returncode == 0
    failed = wait_for_status(dstack, "task.flaky", {"failed"})
    first = failed["jobs"][0]["id"]
    ended = datetime.fromisoformat(failed["jobs"][0]["finished_at"]).timestamp()

    def tick(at: float) -> None:
        watcher = Watcher(Project(project, agent_dir=agent_dir, clock=FakeClock(at)))
        asyncio.run(_tick_and_close(watcher))

    tick(ended + 1)  # the first failure seen: it waits for its retry
    assert state(project)["resources"]["task.flaky"]["status"] == "pending"

    stopped = dstack("stop", "flaky", "-y")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == "task.flaky: its retry is cancelled: terminated\n"
    [row] = json.loads(dstack("ps", "--json", "-a").stdout)
    assert (row["status"], row["notes"]) == ("terminated", [])

    tick(ended + 3600)  # long past the backoff, within the retry's duration
    entry = state(project)["resources"]["task.flaky"]
    assert entry["status"] == "terminated"
    assert entry["attributes"]["jobs"][0]["id"] == first  # never submitted again
    assert "last_failure_at" in entry["attributes"]["retry"]  # its history stays
    assert dstack("destroy", "-y").returncode == 0
