"""`dstack watch --once --metrics-file` on the local fleet: the metrics Prometheus scrapes, and
the same over HTTP while watch runs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import task


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_watch_exports_runs_jobs_and_hosts(dstack: Dstack, tmp_path: Path, cli_env) -> None:
    project = tmp_path / "project"
    (project / "sleep.dstack.yml").write_text(task("sleeper", "sleep 60"))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.sleeper", {"running"})
    out = tmp_path / "watch.prom"
    ticked = dstack("watch", "--once", "--metrics-file", str(out))
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    found = samples(out.read_text())
    assert found[("dstack_runs", (("status", "running"),))] == 1
    assert found[("dstack_jobs", (("status", "running"),))] == 1
    assert found[("dstack_watch_leader", ())] == 1
    assert found[("dstack_task_queue_depth", ())] == 0
    assert any(name == "dstack_reconcile_duration_seconds_count" for name, _ in found)

    # served over HTTP on loopback while watch runs
    watch = subprocess.Popen(
        [sys.executable, "-m", "dstack_plan.cli", "watch", "--interval", "1s",
         "--metrics-port", "0"],
        cwd=project, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watch.stdout is not None
        line = watch.stdout.readline()
        assert line.startswith("Metrics: http://127.0.0.1:"), line + watch.stderr.read()
        url = line.split()[1]
        deadline = time.monotonic() + 20
        while True:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            if ("dstack_runs", (("status", "running"),)) in samples(body) and samples(body)[
                ("dstack_runs", (("status", "running"),))
            ] == 1:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.2)
    finally:
        watch.send_signal(signal.SIGINT)
        assert watch.wait(15) == 0, watch.stderr.read() if watch.stderr else ""
    assert dstack("destroy", "-y").returncode == 0
