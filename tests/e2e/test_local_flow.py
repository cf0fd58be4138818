"""The quickstart loop on the built-in local fleet, through the CLI, with a real agent."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack

# the engine's loop, once per state backend: the local file and S3 (moto)
pytestmark = pytest.mark.usefixtures("state_backend")

TASK = """\
type: task
name: hello
env:
  - GREETING=hi from the test
commands:
  - echo "$GREETING"
  - python3 -c "print('answer', 6 * 7)"
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def wait_for_status(dstack: Dstack, address: str, wanted: set[str], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        rows = json.loads(dstack("ps", "--json", "-a").stdout)
        row = next((r for r in rows if r["address"] == address), None)
        if row and row["status"] in wanted:
            return row
        assert time.monotonic() < deadline, f"{address} never reached {wanted}: {row}"
        time.sleep(0.2)


def state(project: Path) -> dict:
    """The project's state as stored (its JSON form), from whichever backend it uses."""
    from dstack_plan.state.select import open_backend

    return json.loads(open_backend(project).read().state.to_json())


def test_init_plan_apply_ps_logs_replan_change_destroy(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    assert dstack("init").returncode == 0
    assert ".dstack/" in (project / ".gitignore").read_text()
    (project / "hello.dstack.yml").write_text(TASK)

    planned = dstack("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stderr
    assert '+ task "hello"' in planned.stdout
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in planned.stdout
    assert "fleet local" in planned.stdout

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "Apply complete! Resources: 1 added, 0 changed, 0 destroyed." in applied.stdout

    row = wait_for_status(dstack, "task.hello", {"done"})
    assert row["fleet"] == "local"
    logs = dstack("logs", "hello")
    assert logs.returncode == 0, logs.stderr
    assert "hi from the test" in logs.stdout and "answer 42" in logs.stdout

    again = dstack("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout
    assert "No changes." in again.stdout

    (project / "hello.dstack.yml").write_text(TASK.replace("6 * 7", "6 * 8"))
    changed = dstack("plan", "--detailed-exitcode")
    assert changed.returncode == 2
    assert '-/+ task "hello"' in changed.stdout
    assert "# forces replacement" in changed.stdout
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.hello", {"done"})
    assert "answer 48" in dstack("logs", "task.hello").stdout

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert "Destroy complete! Resources: 1 destroyed." in destroyed.stdout
    assert state(project)["resources"] == {}
    agent_jobs = tmp_path / "agent" / "jobs"
    assert not agent_jobs.exists() or not any(agent_jobs.iterdir())


def test_service_keeps_running_and_destroy_stops_its_processes(
    dstack: Dstack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    # two services: process replicas of one port cannot share a host (the plan refuses them)
    (project / "svc.dstack.yml").write_text(
        "\n---\n".join(
            f"type: service\nname: {name}\nport: {port}\nreplicas: 1\n"
            "commands: ['echo serving; exec sleep 300']\n"
            "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}\nstop_duration: 5s\n"
            for name, port in (("web", 18931), ("api", 18932))
        )
    )
    assert dstack("apply", "-y").returncode == 0
    for address in ("service.web", "service.api"):
        assert len(wait_for_status(dstack, address, {"running"})["jobs"]) == 1
    records = [json.loads(p.read_text()) for p in (tmp_path / "agent" / "jobs").glob("*/job.json")]
    pids = [r["pid"] for r in records if r.get("pid")]
    assert len(pids) == 2
    assert dstack("destroy", "-y").returncode == 0
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"process {pid} of the destroyed service is still alive")


def test_apply_without_approval_and_no_input_refuses(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "t.dstack.yml").write_text(TASK)
    result = dstack("apply", "--no-input")
    assert result.returncode == 1
    assert "needs confirmation" in result.stderr
    assert state(tmp_path / "project")["resources"] == {}


def test_prompt_accepts_only_yes(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "t.dstack.yml").write_text(TASK)
    refused = dstack("apply", stdin="y\n")
    assert refused.returncode == 1
    assert "Apply cancelled." in refused.stdout
    accepted = dstack("apply", stdin="yes\n")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "Apply complete!" in accepted.stdout


def test_saved_plan_applies_exactly_and_refuses_when_stale(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(TASK)
    assert dstack("plan", "-out", "p1.json").returncode == 0
    assert dstack("plan", "-out", "p2.json").returncode == 0
    # the YAML changes after planning: applying the saved plan still does what it showed
    (project / "t.dstack.yml").write_text(TASK.replace("hello", "other"))
    first = dstack("apply", "p1.json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert list(state(project)["resources"]) == ["task.hello"]
    stale = dstack("apply", "p2.json")
    assert stale.returncode == 1
    assert "is stale" in stale.stderr
