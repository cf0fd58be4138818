"""`dstack events` on a state dir whose event log was written through the Python API."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from dstack_plan.state.events import Event, EventLog, span_id
from dstack_plan.state.local import LocalBackend
from tests.e2e.conftest import CLI, Dstack


def job_event(time_: float, new: str, old: str | None, reason: str | None = None) -> Event:
    return Event(
        time=time_,
        address="task.train",
        kind="job",
        span_id=span_id("task.train", 1),
        old_status=old,
        new_status=new,
        job_id="train-0-0-0",
        reason=reason,
    )


def write_events(project: Path, events: list[Event], state: str = "state.json") -> None:
    EventLog(LocalBackend(project / ".dstack" / state)).append(events)


def test_events_table_and_json_lines(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    fleet = Event(
        time=1_764_590_400.0,  # 2025-12-01T12:00:00Z
        address="fleet.onprem",
        kind="fleet",
        span_id=span_id("fleet.onprem", 1),
        new_status="active",
    )
    failed = job_event(1_764_590_405.5, "failed", "running", "exit code 3")
    write_events(project, [fleet, failed])

    result = dstack("events")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "TIME                  ADDRESS       JOB          STATUS             REASON",
        "2025-12-01T12:00:00Z  fleet.onprem  -            - -> active",
        "2025-12-01T12:00:05Z  task.train    train-0-0-0  running -> failed  exit code 3",
    ]

    result = dstack("events", "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[1] == {
        "time": 1_764_590_405.5,
        "address": "task.train",
        "kind": "job",
        "span_id": "task.train@1",
        "old_status": "running",
        "new_status": "failed",
        "job_id": "train-0-0-0",
        "reason": "exit code 3",
        "host": None,
    }
    assert [Event.model_validate(line) for line in lines] == [fleet, failed]


def test_since_takes_a_duration_or_an_rfc3339_time(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    now = time.time()
    write_events(
        project,
        [job_event(now - 7200, "running", "pending"), job_event(now - 600, "done", "running")],
    )
    recent = dstack("events", "--since", "1h", "--json")
    assert recent.returncode == 0, recent.stderr
    assert [json.loads(line)["new_status"] for line in recent.stdout.splitlines()] == ["done"]

    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 7300))
    both = dstack("events", "--since", old, "--json")
    assert len(both.stdout.splitlines()) == 2

    none = dstack("events", "--since", "1m")
    assert none.returncode == 0
    assert none.stdout.startswith("No events since ")

    bad = dstack("events", "--since", "yesterday")
    assert bad.returncode == 1
    assert "--since 'yesterday': expected a duration" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_an_empty_log_says_so(dstack: Dstack, tmp_path: Path) -> None:
    result = dstack("events")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "No events. (dstack watch records status changes here as it sees them.)\n"
    )
    assert not (tmp_path / "project" / ".dstack").exists()  # reading creates nothing
    assert dstack("events", "--json").stdout == ""


def test_state_option_reads_the_log_beside_that_state(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_events(project, [job_event(1_764_590_400.0, "running", "pending")], state="prod.json")
    assert (project / ".dstack" / "prod.events.jsonl").exists()
    assert dstack("events").stdout.startswith("No events.")
    result = dstack("events", "--state", ".dstack/prod.json", "--json")
    assert json.loads(result.stdout)["new_status"] == "running"


def test_a_missing_directory_is_an_error(dstack: Dstack) -> None:
    result = dstack("events", "no-such-dir")
    assert result.returncode == 1
    assert "no such directory: no-such-dir" in result.stderr


def read_lines(stream: int, want: int, timeout: float) -> list[str]:
    seen = b""
    deadline = time.monotonic() + timeout
    while seen.count(b"\n") < want and time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.2)
        if ready:
            chunk = os.read(stream, 65536)
            if not chunk:
                break
            seen += chunk
    return seen.decode().splitlines()


def test_follow_prints_new_events_until_ctrl_c(cli_env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    process = subprocess.Popen(
        [*CLI, "events", "--follow"],
        cwd=project,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        out = process.stdout.fileno()
        first = read_lines(out, 1, timeout=60)
        assert first == [
            "No events. (dstack watch records status changes here as it sees them.)"
            " Waiting for new ones (Ctrl-C to stop)."
        ]
        write_events(project, [job_event(1_764_590_400.0, "running", "pending")])
        shown = read_lines(out, 2, timeout=30)
        assert shown[0].split() == ["TIME", "ADDRESS", "JOB", "STATUS", "REASON"]
        assert shown[1].split() == [
            "2025-12-01T12:00:00Z",
            "task.train",
            "train-0-0-0",
            "pending",
            "->",
            "running",
        ]
        write_events(project, [job_event(1_764_590_401.0, "done", "running", "exit code 0")])
        more = read_lines(out, 1, timeout=30)
        assert more[0].split()[-4:] == ["done", "exit", "code", "0"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        stderr = process.stderr.read().decode()
        assert "Traceback" not in stderr and "Interrupted" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
