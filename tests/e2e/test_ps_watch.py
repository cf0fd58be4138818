"""`dstack ps` notes and `ps -w` with a real local agent: a service with `scaling` keeps its
minimum and says so; `ps -w` shows the table again until Ctrl-C, which exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES

SCALED = (
    "type: service\nname: api\nport: 18977\nreplicas: 1..4\n"
    "scaling: {metric: rps, target: 10}\nstop_duration: 1s\n"
    f"commands: ['exec sleep 300']\n{RESOURCES}"
)
NOTE = "scaling by rps needs a serving `dstack watch`: keeps 1 replica (replicas 1..4)"


def test_scaling_keeps_the_minimum_and_ps_watch_renders_until_interrupted(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "api.dstack.yml").write_text(SCALED)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    row = wait_for_status(dstack, "service.api", {"running"})
    assert len(row["jobs"]) == 1
    assert row["notes"] == [
        "not served: no dstack watch runs; `dstack watch` serves it on 127.0.0.1:3000",
        NOTE,
    ]
    assert NOTE in dstack("ps").stdout

    watching = subprocess.Popen(
        [*CLI, "ps", "-w", "--interval", "0.2s"],
        cwd=project,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 30
        assert watching.stdout is not None
        while sum("service.api" in line for line in seen) < 2:
            assert time.monotonic() < deadline, seen
            line = watching.stdout.readline()
            assert line, watching.stderr.read() if watching.stderr else ""
            seen.append(line)
        watching.send_signal(signal.SIGINT)
        assert watching.wait(timeout=30) == 0
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    assert sum(line.startswith("NAME") for line in seen) >= 2  # the whole table, each time
    assert json.loads(dstack("ps", "--json").stdout)[0]["status"] == "running"
    assert dstack("destroy", "-y").returncode == 0
