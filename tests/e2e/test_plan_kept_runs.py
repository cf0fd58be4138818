"""A run the plan keeps is shown where its jobs are, not where it would be placed now: a
finished task's "no changes" line names the host it ran on, with its end."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES


def test_a_finished_task_is_shown_where_it_ran(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "hello.dstack.yml").write_text(
        f"type: task\nname: hello\ncommands: ['echo hi']\n{RESOURCES}"
    )
    assert dstack("apply", "-y").returncode == 0
    row = wait_for_status(dstack, "task.hello", {"done"})
    [host] = row["hosts"]
    planned = dstack("plan")
    assert planned.returncode == 0, planned.stderr
    [line] = [ln for ln in planned.stdout.splitlines() if "task.hello: no changes" in ln]
    assert f"fleet local (local) on {host}," in line
    assert line.endswith("— ran there (done))")
    as_json = json.loads(dstack("plan", "--json").stdout)
    [kept] = [c for c in as_json["resource_changes"] if c["address"] == "task.hello"]
    assert kept["placement"]["hosts"] == [host]
    assert dstack("destroy", "-y").returncode == 0
