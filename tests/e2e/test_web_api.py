"""The read-only HTTP API of `dstack watch --ui` and `dstack ui`, against real runs on the
local fleet: every endpoint's JSON against its model, logs followed as server-sent events while
a job in a Docker container writes them, the token rule off loopback, and no secret value in
any answer."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from dstack_plan.inspect.fleets import FleetList
from dstack_plan.inspect.runs import RunView
from dstack_plan.inspect.top import TopView
from dstack_plan.state.events import Event
from dstack_plan.web.app import ROUTES
from dstack_plan.web.models import (
    ApiError,
    ApiIndex,
    JobLogs,
    LogEnd,
    LogLine,
    MetricsHistory,
    PlanView,
)
from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES

SECRET = "s3cr3t-Api-Value-77c1b2"
SECRETIVE = (
    "type: task\nname: secretive\nenv:\n  - API_TOKEN=${{ secrets.API_TOKEN }}\n"
    'commands:\n  - echo "token=$API_TOKEN"\n  - exec sleep 300\n' + RESOURCES
)


def chatty(image: str) -> str:
    """A task in a container that writes a line every half second, six times."""
    return (
        f"type: task\nname: chatty\nimage: {image}\ncommands:\n"
        "  - 'for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done'\n" + RESOURCES
    )


@contextmanager
def serving(args: list[str], project: Path, env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """Run `dstack ARGS` until it says `UI: URL`; yield (URL, everything it printed before)."""
    process = subprocess.Popen(
        [*CLI, *args], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        printed = ""
        while not printed.endswith("\n") or not printed.splitlines()[-1].startswith("UI: "):
            line = process.stdout.readline()
            assert line, printed + (process.stderr.read() if process.stderr else "")
            printed += line
        yield printed.splitlines()[-1].split()[1], printed
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(20) == 0, process.stderr.read() if process.stderr else ""
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def secretive_project(dstack: Dstack, project: Path) -> Path:
    """`project` with the secret API_TOKEN set and `task.secretive` (which prints it) running."""
    (project / ".dstack").mkdir(mode=0o700)
    (project / ".dstack" / "secrets.yml").write_text(f"API_TOKEN: {SECRET}\n")
    (project / ".dstack" / "secrets.yml").chmod(0o600)
    (project / "secretive.dstack.yml").write_text(SECRETIVE)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.secretive", {"running"})
    return project


def get(url: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url.rstrip("/") + path, timeout=60, **kwargs)


def test_every_endpoint_answers_its_model_and_logs_follow_live(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], docker_client: object
) -> None:
    from tests.infra.docker_images import ensure_busybox_image

    project = secretive_project(dstack, tmp_path / "project")
    image = ensure_busybox_image(docker_client)
    watch = ["watch", "--ui", "--bind", "127.0.0.1:0", "--interval", "0.5s"]
    with serving(watch, project, cli_env) as (url, printed):
        assert "token" not in printed.lower()  # loopback: no token made or needed
        answers: list[str] = []

        def check(path: str, model: type, many: bool = False) -> Any:
            response = get(url, path)
            assert response.status_code == 200, (path, response.text)
            assert response.headers["Content-Type"].startswith("application/json")
            answers.append(response.text)
            shape = list[model] if many else model  # type: ignore[valid-type]
            return TypeAdapter(shape).validate_python(response.json())

        # the job in a container: its lines arrive one by one while it writes them
        (project / "chatty.dstack.yml").write_text(chatty(image))
        applied = dstack("apply", "-y", "--target", "task.chatty")
        assert applied.returncode == 0, applied.stdout + applied.stderr

        def follow(
            headers: dict[str, str],
        ) -> tuple[list[tuple[float, LogLine, str | None]], LogEnd]:
            """The followed lines (when each came, the line, the id its event carried) and
            the end event."""
            received: list[tuple[float, LogLine, str | None]] = []
            address = f"{url}api/runs/chatty/logs?follow=1"
            with httpx.stream("GET", address, headers=headers, timeout=60) as stream:
                assert stream.status_code == 200
                assert stream.headers["Content-Type"].startswith("text/event-stream")
                event, event_id = None, None
                for line in stream.iter_lines():
                    answers.append(line)
                    if not line:  # an event ends
                        event, event_id = None, None
                    elif line.startswith("id: "):
                        event_id = line.removeprefix("id: ")
                    elif line.startswith("event: "):
                        event = line.removeprefix("event: ")
                    elif line.startswith("data: ") and event == "line":
                        text = LogLine.model_validate_json(line.removeprefix("data: "))
                        received.append((time.monotonic(), text, event_id))
                    elif line.startswith("data: ") and event == "end":
                        return received, LogEnd.model_validate_json(line.removeprefix("data: "))
            raise AssertionError(f"the stream ended without an end event: {received}")

        lines = [f"line {i}" for i in range(1, 7)]
        received, end = follow({})
        assert [r.text for _, r, _ in received] == lines
        assert received[-1][0] - received[0][0] > 1.5, "the lines came all at once, not live"
        assert end.status == "done" and end.exit_code == 0
        # a client that reconnects with the last id it saw goes on from the next line
        marked = [(n, event_id) for n, (_, _, event_id) in enumerate(received) if event_id]
        assert received[-1][2] is not None and len(marked) >= 2, received  # each batch's last
        n, seen = marked[len(marked) // 2 - 1]
        resumed, _ = follow({"Last-Event-ID": seen})
        assert [r.text for _, r, _ in resumed] == lines[n + 1 :]
        again, _ = follow({"Last-Event-ID": "not-ours"})  # an id we never sent: from the start
        assert [r.text for _, r, _ in again] == lines

        index = check("/api/", ApiIndex)
        assert isinstance(index, ApiIndex) and index.recording_history
        runs = check("/api/runs", RunView, many=True)
        assert {r.address for r in runs} == {"task.secretive", "task.chatty"}
        one = check("/api/runs/task.secretive", RunView)
        assert isinstance(one, RunView) and one.status == "running" and len(one.jobs) == 1
        logs = check("/api/runs/secretive/logs", JobLogs)
        assert isinstance(logs, JobLogs)
        assert [line.text for line in logs.lines] == ["token=(sensitive)"]
        assert check("/api/fleets", FleetList) == FleetList()  # only the implicit local fleet
        hosts = check("/api/hosts", TopView)
        assert isinstance(hosts, TopView) and hosts.hosts[0].agent == "ok"
        events = check("/api/events", Event, many=True)
        assert any(e.address == "task.chatty" and e.new_status == "done" for e in events)
        check("/api/events?since=1h&address=task.chatty&limit=1", Event, many=True)
        plan = check("/api/plan", PlanView)
        assert isinstance(plan, PlanView)
        assert {c.address: c.action.value for c in plan.plan.changes}["task.secretive"] == "no-op"
        deadline = time.monotonic() + 20
        while True:
            history = check("/api/metrics/history", MetricsHistory)
            assert isinstance(history, MetricsHistory) and history.recording
            if history.samples and history.samples[-1].runs.get("running") == 1:
                break
            assert time.monotonic() < deadline, history
            time.sleep(0.3)
        assert history.max_samples > 0 and history.max_age_s > 0
        times = [s.time for s in history.samples]
        assert times == sorted(times)

        # errors are JSON too; nothing but GET and HEAD
        for path, status in (("/api/runs/nope", 404), ("/api/runs/chatty/logs?job=3", 404),
                             ("/api/events?limit=x", 400), ("/api/nothing", 404)):  # fmt: skip
            response = get(url, path)
            assert response.status_code == status, (path, response.text)
            ApiError.model_validate(response.json())
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            refused = httpx.request(method, f"{url}api/runs", timeout=10)
            assert refused.status_code == 405, method
            assert {m.strip() for m in refused.headers["Allow"].split(",")} == {"GET", "HEAD"}
        assert httpx.head(f"{url}api/runs", timeout=30).status_code == 200

        document = get(url, "/openapi.json").json()
        assert document["openapi"].startswith("3.1")
        assert set(document["paths"]) == {r.path for r in ROUTES} | {"/openapi.json"}
        for path_item in document["paths"].values():
            assert set(path_item) == {"get"}
        answers.append(json.dumps(document))

    assert all(SECRET not in text for text in answers)
    assert dstack("destroy", "-y").returncode == 0


def test_off_loopback_the_token_is_needed(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "hello.dstack.yml").write_text(
        f"type: task\nname: hello\ncommands: [echo hi]\n{RESOURCES}"
    )
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.hello", {"done"})
    token_file = project / ".dstack" / "ui-token"
    with serving(["ui", "--bind", "127.0.0.2:0"], project, cli_env) as (url, printed):
        assert url.startswith("http://127.0.0.2:")
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert printed.count(token) == 1, printed  # printed once, when made
        assert f"{url}?token={token} in a browser" in printed  # as the link a browser opens
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            refused = get(url, "/api/runs", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.headers["WWW-Authenticate"].startswith("Bearer")
            ApiError.model_validate(refused.json())
        assert get(url, "/openapi.json").status_code == 401
        allowed = get(url, "/api/runs", headers={"Authorization": f"Bearer {token}"})
        assert allowed.status_code == 200
        assert [r.address for r in TypeAdapter(list[RunView]).validate_python(allowed.json())] == [
            "task.hello"
        ]
        history = get(url, "/api/metrics/history", headers={"Authorization": f"Bearer {token}"})
        assert MetricsHistory.model_validate(history.json()).recording is False  # no watch here
        posted = httpx.post(f"{url}api/runs", headers={"Authorization": f"Bearer {token}"})
        assert posted.status_code == 405
    with serving(["ui", "--bind", "127.0.0.2:0"], project, cli_env) as (url, printed):
        assert token not in printed  # the second start reuses it, unprinted
        assert f"{url}?token=TOKEN in a browser" in printed  # and says where it is
        assert get(url, "/api/", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    # loopback proper needs none, and says nothing of a token
    with serving(["ui", "--bind", "127.0.0.1:0"], project, cli_env) as (url, printed):
        assert get(url, "/api/runs").status_code == 200
        assert "token" not in printed.lower()


@pytest.mark.parametrize("bind", ["nonsense", "127.0.0.1:99999", "::1:3000"])
def test_a_bad_bind_is_a_clear_error(dstack: Dstack, bind: str) -> None:
    result = dstack("ui", "--bind", bind)
    assert result.returncode == 1
    assert "--bind" in result.stdout + result.stderr
