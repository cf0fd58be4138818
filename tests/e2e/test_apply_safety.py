"""Crash safety (kill -9 mid-apply) and two applies at once."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dstack_plan.agent.client import AgentClient
from dstack_plan.plan.planner import PlanOptions
from dstack_plan.project import Project
from dstack_plan.state.codec import parse_state
from dstack_plan.state.local import JOURNAL_ENV
from dstack_plan.state.select import open_backend
from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import state

TASKS = """\
type: task
name: t{i}
commands: ["echo run {gen} of t{i}", "sleep 0.{i}"]
resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}
stop_duration: 2s
"""


def write_project(project: Path, generation: int) -> None:
    text = "---\n".join(TASKS.format(i=i, gen=generation) for i in range(1, 5))
    (project / "tasks.dstack.yml").write_text(text)


async def agent_jobs(agent_dir: Path, deployment: str) -> set[tuple[str, str]]:
    """(run name, job id) of every job on the agent that belongs to this project's state."""
    if not (agent_dir / "agent.json").exists():
        return set()  # killed before it ever started the agent
    async with AgentClient.from_data_dir(agent_dir) as client:
        jobs = await client.list_jobs()
    return {
        (j.run_name, j.id)
        for j in jobs
        if (j.spec.get("labels") or {}).get("deployment") == deployment
    }


async def check_and_converge(project_dir: Path, agent_dir: Path) -> None:
    state_file = project_dir / ".dstack" / "state.json"
    if state_file.exists():
        parse_state(state_file.read_text(), str(state_file))  # always parses
    project = Project(project_dir, agent_dir=agent_dir)  # the backend the test runs on
    try:
        snapshot = project.backend.read()  # on S3: the object's checksum holds and it parses
        recorded = {r.name for r in snapshot.state.resources.values()}
        for run_name, job_id in await agent_jobs(agent_dir, project.deployment.key):
            assert run_name in recorded, f"job {job_id} exists but state forgot run {run_name}"
        plan, _ = await project.plan(PlanOptions())
        async with project.locked("apply"):
            report = await project.apply(plan)
        failures = [(r.address, r.message) for r in report.failed]
        assert report.ok, (report.summary(), failures)
        again, _ = await project.plan(PlanOptions())
        assert not again.has_changes, [(c.address, c.action, c.reason) for c in again.changes]
    finally:
        await project.close()


@pytest.mark.slow
def test_kill_9_during_apply_never_loses_track(
    tmp_path: Path, cli_env: dict[str, str], agent_dir: Path, state_backend: str
) -> None:
    # the local backend takes the most kill points; on S3 (the same engine, another commit
    # path) fewer trials cover its compare-and-swap and keep the suite's time in check
    _kill_trials(
        tmp_path, cli_env, agent_dir, state_backend, 20 if state_backend == "local" else 8
    )


@pytest.mark.slow
def test_kill_9_during_apply_never_loses_track_with_the_journal(
    tmp_path: Path, cli_env: dict[str, str], agent_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local state's journal (commits as appended lines, `state/journal.py`) from the
    first commit on: the same guarantees."""
    cli_env[JOURNAL_ENV] = "0"
    monkeypatch.setenv(JOURNAL_ENV, "0")
    killed_with_a_journal = _kill_trials(tmp_path, cli_env, agent_dir, "local", 10)
    assert killed_with_a_journal > 0  # the kills did land on journaled states


def _kill_trials(
    tmp_path: Path, cli_env: dict[str, str], agent_dir: Path, state_backend: str, trials: int
) -> int:
    """Applies killed at random moments, each followed by a check that the next apply
    converges with no job lost or orphaned; how many kills left a local state journal."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    rng = random.Random(1234)
    journaled = 0
    for trial in range(trials):
        write_project(project, trial)
        proc = subprocess.Popen(
            [*CLI, "apply", "-y", "--parallelism", "2"],
            cwd=project,
            env=cli_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.3, 1.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        journaled += (project / ".dstack" / "state.json.journal").exists()
        if state_backend == "s3":
            # no OS drops an S3 lock: a killed holder's stays until its lease ends (5 min;
            # takeover is tested in tests/integration/test_s3_lock.py) or is unlocked by id
            backend = open_backend(project)
            holder = backend.read_lock_info()
            if holder is not None:
                backend.unlock(holder.id)
        asyncio.run(check_and_converge(project, agent_dir))
    return journaled


@pytest.mark.usefixtures("state_backend")
def test_second_apply_sees_the_lock_holder_and_waits_with_timeout(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    write_project(project, 0)
    first = subprocess.Popen(
        [*CLI, "apply"],
        cwd=project,
        env=cli_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    backend = open_backend(project)
    deadline = time.monotonic() + 30
    while (holder := backend.read_lock_info()) is None:
        assert time.monotonic() < deadline and first.poll() is None, "first apply never locked"
        time.sleep(0.05)

    second = dstack("apply", "-y")
    assert second.returncode == 1
    assert "Lock Info" in second.stderr and "apply" in second.stderr, second.stderr
    assert holder.id in second.stderr

    waiting = subprocess.Popen(
        [*CLI, "apply", "-y", "--lock-timeout", "60"],
        cwd=project,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    assert waiting.poll() is None, "the waiting apply should still be waiting for the lock"
    out, err = first.communicate("yes\n", timeout=120)
    assert first.returncode == 0, out + err
    out2, err2 = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, out2 + err2
    assert "No changes." in out2
    assert sorted(state(project)["resources"]) == [f"task.t{i}" for i in range(1, 5)]
