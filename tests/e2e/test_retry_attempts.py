"""A retried run's earlier attempts stay readable, with the real local agent: the first
attempt's job (its log) is kept on the agent when `dstack watch` resubmits the run;
`dstack logs --attempt N`, `ps --json`, `ps --run`, the API's `?attempt=N` and the run page
read it; `dstack destroy` removes the jobs of every attempt."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
from pydantic import TypeAdapter

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.client import AgentClient
from dstack_plan.clock import FakeClock
from dstack_plan.inspect.runs import RunView
from dstack_plan.project import Project
from dstack_plan.watch.loop import Watcher
from dstack_plan.web.models import ApiError, JobLogs
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_watch_retry import _tick_and_close
from tests.e2e.test_web_api import get, serving


def flaky(marker: Path) -> str:
    command = f"test -f {marker} || {{ touch {marker}; echo first try; exit 3; }}; echo second try"
    return (
        f"type: task\nname: flaky\ncommands: [{json.dumps(command)}]\n"
        f"retry: {{on_events: [error], duration: 1m}}\n{RESOURCES}"
    )


def retried(dstack: Dstack, tmp_path: Path, agent_dir: Path) -> tuple[Path, str, str]:
    """`task.flaky` failed once, resubmitted by watch, and done: (project, the first
    attempt's job id, the second's)."""
    project = tmp_path / "project"
    (project / "flaky.dstack.yml").write_text(flaky(tmp_path / "failed-once"))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.flaky", {"failed"})
    first = state(project)["resources"]["task.flaky"]["attributes"]["jobs"][0]["id"]
    ticked = dstack("watch", "--once")  # pending: placed again after 15 s, on watch's clock
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    later = FakeClock(time.time() + 16)
    asyncio.run(_tick_and_close(Watcher(Project(project, agent_dir=agent_dir, clock=later))))
    entry = state(project)["resources"]["task.flaky"]
    second = entry["attributes"]["jobs"][0]["id"]
    assert second != first
    wait_for_status(dstack, "task.flaky", {"done"})
    return project, first, second


def agent_jobs(agent_dir: Path) -> dict[str, JobInfo]:
    async def listed() -> dict[str, JobInfo]:
        async with AgentClient.from_data_dir(agent_dir) as client:
            return {j.id: j for j in await client.list_jobs(run_name="flaky")}

    return asyncio.run(listed())


def test_every_attempt_of_a_retried_run_can_be_read_and_destroy_removes_them_all(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project, first, second = retried(dstack, tmp_path, agent_dir)

    # the first attempt's job is still on the agent, finished: it holds nothing there
    kept = agent_jobs(agent_dir)
    assert set(kept) == {first, second}
    assert kept[first].finished and kept[first].exit_code == 3 and not kept[first].gpus

    one = dstack("logs", "flaky", "--attempt", "1")
    assert (one.returncode, one.stdout) == (0, "first try\n"), one.stderr
    assert dstack("logs", "flaky").stdout == "second try\n"
    assert dstack("logs", "flaky", "--attempt", "2").stdout == "second try\n"
    missing = dstack("logs", "flaky", "--attempt", "3")
    assert missing.returncode == 1
    assert "task.flaky has no attempt 3 (its attempts: 1-2)" in missing.stderr, missing.stderr

    lines = [json.loads(line) for line in dstack("logs", "flaky", "--json", "--attempt", "1")
             .stdout.splitlines()]  # fmt: skip
    output = [(e["job_id"], e["message"]) for e in lines if e["event"] == "job_output"]
    assert output == [(first, "first try")]
    assert any(e["event"] == "status_changed" for e in lines)  # the run's events with it

    [row] = json.loads(dstack("ps", "--json").stdout)
    attempts = row["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "failed"), (2, "done")]
    assert attempts[0]["reason"] == "container_exited_with_error: exited with code 3"
    assert [j["id"] for j in attempts[0]["jobs"]] == [first]
    assert [j["id"] for j in attempts[1]["jobs"]] == [second] == [j["id"] for j in row["jobs"]]
    assert attempts[0]["hosts"] == row["hosts"] and attempts[0]["ended_at"] is not None
    shown = dstack("ps", "--run", "flaky")
    assert shown.returncode == 0, shown.stderr
    assert "Attempts of task.flaky:" in shown.stdout
    assert "exited with code 3" in shown.stdout and "2 (latest)" in shown.stdout
    assert dstack("ps", "--run", "nope").returncode == 1

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert agent_jobs(agent_dir) == {}  # neither attempt's job is left
    assert "task.flaky" not in state(project)["resources"]


def test_the_api_and_the_run_page_read_an_earlier_attempt(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, cli_env: dict[str, str]
) -> None:
    project, first, second = retried(dstack, tmp_path, agent_dir)
    with serving(["ui", "--bind", "127.0.0.1:0"], project, cli_env) as (url, _):
        response = get(url, "/api/runs/flaky/logs?attempt=1")
        assert response.status_code == 200, response.text
        logs = JobLogs.model_validate(response.json())
        assert (logs.job_id, logs.attempt, logs.status) == (first, 1, "failed")
        assert [line.text for line in logs.lines] == ["first try"]
        latest = JobLogs.model_validate(get(url, "/api/runs/flaky/logs").json())
        assert (latest.job_id, latest.attempt) == (second, 2)
        assert [line.text for line in latest.lines] == ["second try"]

        missing = get(url, "/api/runs/flaky/logs?attempt=3")
        assert missing.status_code == 404
        assert "its attempts: 1-2" in ApiError.model_validate(missing.json()).error
        assert get(url, "/api/runs/flaky/logs?attempt=x").status_code == 400

        # a finished attempt's log followed: its lines, then the end
        with httpx.stream(
            "GET", f"{url}api/runs/flaky/logs?follow=1&attempt=1", timeout=60
        ) as stream:
            assert stream.status_code == 200
            followed = "\n".join(stream.iter_lines())
        assert '"text":"first try"' in followed and "event: end" in followed

        view = TypeAdapter(RunView).validate_python(get(url, "/api/runs/task.flaky").json())
        assert [(a.attempt, a.status) for a in view.attempts] == [(1, "failed"), (2, "done")]
        document = get(url, "/openapi.json").json()
        params = document["paths"]["/api/runs/{run}/logs"]["get"]["parameters"]
        assert "attempt" in {p["name"] for p in params}

        page = get(url, "/runs/task.flaky?attempt=1")
        assert page.status_code == 200
        assert 'id="attempts"' in page.text and "attempt 1, replica 0, job 0" in page.text
        assert "first try" in page.text and "second try" not in page.text
        assert "/runs/task.flaky?replica=0&amp;job=0&amp;attempt=1" in page.text
        assert "second try" in get(url, "/runs/task.flaky").text
    assert dstack("destroy", "-y").returncode == 0
