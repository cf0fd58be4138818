"""`dstack logs --json` and `dstack watch --log-format json` with a real local agent: a run's
lifecycle (apply, watch ticks, a failure) comes out in time order under one span id,
`--since` cuts by time, and `dstack logs -f` works while a `dstack watch` process runs."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import task

KEYS = [
    "ts",
    "level",
    "event",
    "address",
    "job_id",
    "host",
    "resource_type",
    "span_id",
    "message",
    "logger",
]


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for_event(dstack: Dstack, address: str, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        events = json_lines(dstack("events", "--json").stdout)
        if any(e["address"] == address and e["new_status"] == status for e in events):
            return
        assert time.monotonic() < deadline, f"no event {address} -> {status}: {events}"
        time.sleep(0.2)


def test_a_failing_run_in_json_logs_while_watch_runs(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(
        task("boom", "echo start", "sleep 1.5", "echo 'GPU lost' >&2", "exit 3")
    )
    watch_err = tmp_path / "watch.err"
    with open(watch_err, "w") as err:
        watcher = subprocess.Popen(
            [*CLI, "--log-format", "json", "watch", "--interval", "0.3s"],
            cwd=project,
            env=cli_env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        assert dstack("apply", "-y").returncode == 0
        followed = dstack("logs", "-f", "boom", timeout=60)
        assert followed.returncode == 0, followed.stderr
        assert followed.stdout == "start\nGPU lost\n"
        streamed = dstack("logs", "-f", "--json", "boom", timeout=60)
        assert streamed.returncode == 0, streamed.stderr
        output = [e for e in json_lines(streamed.stdout) if e["event"] == "job_output"]
        assert [e["message"] for e in output] == ["start", "GPU lost"]
        missing = dstack("logs", "boom", "--json", "--job", "1")
        assert missing.returncode == 1 and "has no job replica=0 job=1" in missing.stderr
        wait_for_event(dstack, "task.boom", "failed")
    finally:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 0
    # watch's own log: one JSON object a line, its status changes with the convention's fields
    logged = json_lines(watch_err.read_text())
    assert logged and all(list(e) == KEYS for e in logged)
    changes = [e for e in logged if e["event"] == "status_changed"]
    failed = [e for e in changes if e["resource_type"] == "run" and "-> failed" in e["message"]]
    assert failed and failed[0]["level"] == "error" and failed[0]["address"] == "task.boom"
    assert any(e["resource_type"] == "job" and e["job_id"] and e["host"] for e in changes)

    shown = dstack("logs", "boom", "--json")
    assert shown.returncode == 0, shown.stderr
    lines = json_lines(shown.stdout)
    assert all(list(e) == KEYS for e in lines)
    output = [e for e in lines if e["event"] == "job_output"]
    assert [e["message"] for e in output] == ["start", "GPU lost"]
    assert all(e["level"] == "info" and e["resource_type"] == "job" for e in output)
    assert all(e["job_id"] == output[0]["job_id"] and e["host"] for e in output)
    statuses = [e for e in lines if e["event"] == "status_changed"]
    assert "-> failed" in statuses[-1]["message"] and statuses[-1]["level"] == "error"
    # in time order, the failure after the output, all of one lifetime under one span
    stamps = [e["ts"] for e in lines]
    assert stamps == sorted(stamps) and lines.index(output[-1]) < lines.index(statuses[-1])
    assert len({e["span_id"] for e in lines}) == 1
    assert {e["span_id"] for e in changes if e["address"] == "task.boom"} == {lines[0]["span_id"]}
    errors = [e for e in lines if e["level"] == "error" and e["resource_type"] == "run"]
    assert errors == [statuses[-1]]
    assert dstack("destroy", "-y").returncode == 0


def test_since_cuts_job_output_by_time(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "t.dstack.yml").write_text(
        task("slow", "echo early", "sleep 2.5", "echo late", "echo later", "exit 1")
    )
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.slow", {"failed"})
    lines = json_lines(dstack("logs", "slow", "--json").stdout)
    assert [e["message"] for e in lines] == ["early", "late", "later"]
    early, late = lines[0]["ts"], lines[1]["ts"]
    assert early < late
    assert dstack("logs", "slow", "--since", late).stdout == "late\nlater\n"
    cut = json_lines(dstack("logs", "slow", "--json", "--since", late).stdout)
    assert [e["message"] for e in cut] == ["late", "later"]
    assert dstack("logs", "slow", "--since", early).stdout == "early\nlate\nlater\n"
    after = datetime.fromisoformat(late.replace("Z", "+00:00")) + timedelta(seconds=2)
    assert dstack("logs", "slow", "--since", after.isoformat()).stdout == ""  # all older
    assert dstack("logs", "slow", "--since", "1h").stdout == "early\nlate\nlater\n"
    # without --log-level/--log-format, watch prints its changes once (stdout), not as logs
    ticked = dstack("watch", "--once")
    assert "task.slow: " in ticked.stdout and "-> failed" in ticked.stdout
    assert "-> failed" not in ticked.stderr
    assert dstack("destroy", "-y").returncode == 0
