"""Two projects on one machine never touch each other's jobs, even after a killed apply.

Both projects declare a task named `train` and keep their state at `.dstack/state.json`
relative to their own directory. Project B's first apply is SIGKILLed right after it
submitted its job and before it recorded it (its state holds the tainted intent); B's next
apply must clean up only B's orphan, never A's running job.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.client import AgentClient
from dstack_plan.apply.deployment import deployment_key
from tests.e2e.conftest import CLI, Dstack

pytestmark = pytest.mark.timeout(300)

TRAIN = """\
type: task
name: train
commands: ["sleep 600"]
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
stop_duration: 1s
"""
ATTEMPTS = 5
"""Tries at stopping B between its intent commit and its job's commit (see `_killed_create`)."""


def _jobs(agent_dir: Path) -> list[JobInfo]:
    async def listed() -> list[JobInfo]:
        async with AgentClient.from_data_dir(agent_dir) as client:
            return await client.list_jobs(run_name="train")

    return asyncio.run(listed())


def _state(project: Path) -> dict:
    return json.loads((project / ".dstack" / "state.json").read_text())


def _train(project: Path) -> dict | None:
    try:
        return _state(project)["resources"].get("task.train")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _killed_create(project: Path, env: dict[str, str], agent_dir: Path, known: set[str]) -> str:
    """Run `apply` in `project` and SIGKILL it after it submitted its job but before it
    recorded it; return the orphan's job id.

    The apply commits a tainted intent, submits the job, then commits the job under the
    state's write lock (`state.json.lock`). Taking that lock as soon as the intent is on disk
    holds the apply just before its second commit, so the kill lands at that exact point.
    """
    state_dir = project / ".dstack"
    state_dir.mkdir(mode=0o700, exist_ok=True)
    for _ in range(ATTEMPTS):
        proc = subprocess.Popen(
            [*CLI, "apply", "-y"],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        fd = os.open(state_dir / "state.json.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + 60
            while (_train(project) or {}).get("status") != "creating":
                assert proc.poll() is None, "apply ended before it committed its intent"
                assert time.monotonic() < deadline, "apply never committed its intent"
                time.sleep(0.001)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if (_train(project) or {}).get("tainted"):
                while not (orphans := {j.id for j in _jobs(agent_dir)} - known):
                    assert time.monotonic() < deadline, "apply never submitted its job"
                    time.sleep(0.02)
                time.sleep(0.3)  # it is now waiting for the lock to record the job
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                assert (_train(project) or {}).get("tainted"), "the job got recorded"
                (orphan,) = orphans
                return orphan
        finally:
            os.close(fd)
        # the apply recorded its job before the lock was taken: undo it and try again
        proc.wait(timeout=60)
        subprocess.run([*CLI, "destroy", "-y"], cwd=project, env=env, timeout=120, check=True)
    raise AssertionError(f"could not stop apply mid-create in {ATTEMPTS} attempts")


def test_a_killed_create_in_one_project_never_deletes_another_projects_job(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], agent_dir: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for project in (a, b):
        project.mkdir()
        (project / "train.dstack.yml").write_text(TRAIN)
    try:
        applied = dstack("apply", "-y", cwd=a)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        (a_job,) = [r["id"] for r in _train(a)["attributes"]["jobs"]]  # type: ignore[index]

        orphan = _killed_create(b, cli_env, agent_dir, known={a_job})

        again = dstack("apply", "-y", cwd=b)
        assert again.returncode == 0, again.stdout + again.stderr
        jobs = {j.id: j for j in _jobs(agent_dir)}
        assert a_job in jobs, "B's apply deleted A's job"
        assert jobs[a_job].status.value == "running", jobs[a_job]
        assert orphan not in jobs, "B's cut-short create left its job behind"
        (b_job,) = [r["id"] for r in _train(b)["attributes"]["jobs"]]  # type: ignore[index]
        assert jobs[b_job].status.value == "running"

        ps = dstack("ps", "--json", cwd=a)
        assert ps.returncode == 0, ps.stderr
        (row,) = [r for r in json.loads(ps.stdout) if r["address"] == "task.train"]
        assert row["status"] == "running" and not row["error"], row
        planned = dstack("plan", "--detailed-exitcode", cwd=a)
        assert planned.returncode == 0, planned.stdout + planned.stderr
        # each project's jobs carry the key of its own state's lineage
        for project, job_id in ((a, a_job), (b, b_job)):
            key = deployment_key(_state(project)["lineage"])
            assert jobs[job_id].spec["labels"]["deployment"] == key
            assert job_id.endswith(f"-{key}")
    finally:
        for project in (a, b):
            dstack("destroy", "-y", cwd=project)


def test_a_saved_plan_for_a_new_state_keys_its_jobs_by_the_lineage_written(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    """The plan ran in another process, against a state that did not exist yet (whose
    lineage was made up for the plan and never stored): the jobs still get the key of the
    lineage the first commit stored, so the next apply finds and cleans up its own."""
    project = tmp_path / "project"
    (project / "train.dstack.yml").write_text(TRAIN)
    try:
        planned = dstack("plan", "-out", "plan.json")
        assert planned.returncode in (0, 2), planned.stdout + planned.stderr
        applied = dstack("apply", "plan.json")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        (job_id,) = [r["id"] for r in _train(project)["attributes"]["jobs"]]  # type: ignore[index]
        (listed,) = [j for j in _jobs(agent_dir) if j.id == job_id]
        assert listed.spec["labels"]["deployment"] == deployment_key(_state(project)["lineage"])
        replaced = dstack("apply", "-y", "--replace", "task.train")
        assert replaced.returncode == 0, replaced.stdout + replaced.stderr
        assert job_id not in {j.id for j in _jobs(agent_dir)}
    finally:
        dstack("destroy", "-y", cwd=project)
