"""benchmarks/watch_scale.py, tiny (2 agents, 4 jobs, 1 tick): it prints its table and one
PASS/FAIL per target, and leaves no namespace, agent, job, watch process or file behind, also
when interrupted with Ctrl-C during the takeover.

The benchmark runs on a copy of its network of its own (slot 8 unless the test run, or its
pytest-xdist worker, has one: `ssh_hosts.SLOT`), so a benchmark running by hand is not torn
down.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, require
from tests.infra import ssh_hosts

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

BENCH = REPO_ROOT / "benchmarks" / "watch_scale.py"
SLOT = ssh_hosts.SLOT or 8
PREFIX = f"dpbench{SLOT}-"
ROWS = ("tick wall s", "CPU % of one core", "takeover: SIGKILL -> it committed s")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpws-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bench_env(short_tmp: Path) -> dict[str, str]:
    reason = ssh_hosts.available()
    if reason is not None:
        require("DSTACK_PLAN_REQUIRE_SSH", reason)
    # TMPDIR: the benchmark's work dir (agents, project, keys) lands in short_tmp
    env = {**os.environ, "DSTACK_PLAN_SSH_TEST_SLOT": str(SLOT), "TMPDIR": str(short_tmp)}
    # SLOT is this pytest-xdist worker's copy already: the benchmark takes it as it is
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def _processes(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"process {proc.name}: {cmdline[:160]}")
    return found


def _leftovers(short_tmp: Path) -> list[str]:
    """Namespaces of the benchmark's network, processes naming `short_tmp` (agents, the
    finisher's job, watch processes) and its work dir."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in listed.splitlines() if line.startswith(PREFIX)]
    found += _processes(str(short_tmp))
    return found + [str(p) for p in short_tmp.glob("dstack-watch-*")]


ARGV = [sys.executable, str(BENCH), "--agents", "2", "--jobs", "4", "--ticks", "1"]


def test_a_tiny_run_reports_every_target_and_cleans_up(
    bench_env: dict[str, str], short_tmp: Path
) -> None:
    done = subprocess.run(
        [*ARGV, "--interval", "1"], env=bench_env, capture_output=True, text=True, timeout=600
    )
    # on a busy 2-core machine a target may be missed (exit 1); the run itself must work
    assert done.returncode in (0, 1), done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for row in ROWS:
        assert any(line.startswith(row) for line in lines), done.stdout + done.stderr
    assert "4 running jobs (2 tasks x 2 nodes)" in done.stdout
    last = lines[-1]
    assert last.startswith("watch_scale: 2 agents, 4 jobs: tick "), last
    assert last.count("PASS") + last.count("FAIL") == 3, last
    assert (done.returncode == 0) == ("FAIL" not in last)
    if ") FAIL, CPU" in last or "%) FAIL" in last:  # a missed tick target: where time went
        assert "where the time of one tick goes" in done.stdout
    assert _leftovers(short_tmp) == []


def test_ctrl_c_during_the_takeover_removes_everything(
    bench_env: dict[str, str], short_tmp: Path
) -> None:
    # its own session, so that the signal goes to its whole group, as Ctrl-C on a terminal
    bench = subprocess.Popen(
        [*ARGV, "--interval", "0.5"],
        env=bench_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        watches: list[str] = []
        while not watches and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.2)
            watches = [p for p in _processes(str(short_tmp)) if " watch " in p]
        assert watches, "no watch process was started"
        os.killpg(bench.pid, signal.SIGINT)
        _, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    assert bench.returncode == 1
    assert err.strip().endswith("interrupted")
    assert _leftovers(short_tmp) == []
