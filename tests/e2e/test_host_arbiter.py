"""One arbiter per host: two projects submit at the same moment to the one local agent (a fake
nvidia-smi reports 2 GPUs), each a task that takes both GPUs. The agent admits one; the other
never holds a GPU beside it: it is queued `pending` saying what it waits for (its `retry`
covers no-capacity) or fails, its error one line naming the GPUs (`runs/admission.py`).

The rounds submit through the SDK, both projects in one event loop (`asyncio.gather` of
`aapply`, as a notebook driving two projects does): twenty rounds of four CLI processes (two
applies, two destroys) cost a minute on a loaded 2-core machine, in process they cost seconds.
Timing decides whether the loser planned before the winner submitted (it lost at the agent
and says so) or after (its plan already saw the GPUs taken). The CLI test makes the race
certain: both saved plans see the GPUs free; applied at once, one loses at the agent; its
`dstack apply` exits 1 with a one-line error and no traceback, or queues the run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.client import AgentClient
from dstack_plan.plan.planner import PlanOptions
from dstack_plan.project import Project
from dstack_plan.runs.admission import CONFLICT
from dstack_plan.sdk import ApplyFailed, Task, aapply
from tests.e2e.conftest import CLI, fake_nvidia_smi
from tests.e2e.test_local_flow import state

pytestmark = pytest.mark.timeout(300)

ROUNDS = 20
TWO_GPUS = """#!/bin/sh
case "$*" in
  *memory.total,uuid*)
    echo "0, NVIDIA L4, 23034, GPU-fake-0"
    echo "1, NVIDIA L4, 23034, GPU-fake-1" ;;
  *utilization.gpu*) echo "0, 0, 1024, 23034"; echo "1, 0, 1024, 23034" ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""
FIELDS = {
    "name": "train",
    "commands": ["sleep 600"],
    "stop_duration": "1s",
    "resources": {"cpu": "1..", "memory": "0.1GB..", "disk": "1GB..", "gpu": 2},
}
RETRY = {"on_events": ["no-capacity"], "duration": "1h"}
WAITS = "waits for 2 GPUs on local"
"""What the loser's reason says it waits for (the placement's note)."""


class Projects:
    """Two project directories sharing the one local agent (the same `cli_env`), which sees
    the fake GPUs (as `gpu_cli` sets it up, for two directories)."""

    def __init__(self, cli_env: dict[str, str], tmp_path: Path, agent_dir: Path) -> None:
        bin_dir = fake_nvidia_smi(tmp_path / "fake-bin", TWO_GPUS)
        self.env = {**cli_env, "PATH": f"{bin_dir}:{cli_env.get('PATH', '/usr/bin:/bin')}"}
        self.dirs = [tmp_path / "project-a", tmp_path / "project-b"]
        for directory in self.dirs:
            directory.mkdir()
        self.agent_dir = agent_dir
        # started once, with the fake GPUs on its PATH, before the first race
        agent = [sys.executable, "-m", "dstack_plan.agent", "start", "--data-dir", str(agent_dir)]
        subprocess.run(agent, env=self.env, check=True, capture_output=True, timeout=60)

    def jobs(self) -> list[JobInfo]:
        """The jobs the agent holds now (every project's)."""

        async def listed() -> list[JobInfo]:
            async with AgentClient.from_data_dir(self.agent_dir) as client:
                return [j for j in await client.list_jobs() if not j.finished]

        return asyncio.run(listed())

    def entries(self) -> list[dict]:
        return [dict(state(d)["resources"].get("task.train") or {}) for d in self.dirs]

    def destroy(self) -> None:
        """Both projects destroyed, in process (what `dstack destroy -y` does)."""

        async def one(directory: Path) -> None:
            project = Project(directory)
            try:
                async with project.locked("destroy", timeout=60):
                    plan, _ = await project.plan(PlanOptions(destroy=True))
                    if plan.has_changes:
                        report = await project.apply(plan)
                        assert report.ok, report
            finally:
                await project.close()

        async def both() -> None:
            await asyncio.gather(*(one(d) for d in self.dirs))

        asyncio.run(both())
        assert not self.jobs()

    def cli(self, *args: str) -> list[subprocess.CompletedProcess[str]]:
        """`dstack ARGS...` in both projects at the same moment."""
        started = [
            subprocess.Popen(
                [*CLI, *args],
                cwd=d,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for d in self.dirs
        ]
        done = []
        for proc in started:
            out, err = proc.communicate(timeout=120)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return done


@pytest.fixture
def projects(
    cli_env: dict[str, str], tmp_path: Path, agent_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Projects:
    """`Projects`, this process set up as the CLI's (`cli_env`) for the in-process steps."""
    made = Projects(cli_env, tmp_path, agent_dir)
    monkeypatch.delenv("DSTACK_STATE", raising=False)
    for name in ("DSTACK_PLAN_AGENT_DIR", "DSTACK_PLAN_SSH_CONFIG_DIR", "DSTACK_PLAN_CACHE_DIR"):
        monkeypatch.setenv(name, cli_env[name])
    monkeypatch.setenv("PATH", made.env["PATH"])
    return made


def one_holder(projects: Projects) -> int:
    """The project whose job holds the GPUs, after checking that one job holds both and no
    GPU is held twice."""
    jobs = projects.jobs()
    held = [i for j in jobs for i in j.gpus]
    assert len(held) == len(set(held)), [(j.id, j.gpus) for j in jobs]
    assert len(jobs) == 1 and sorted(jobs[0].gpus) == [0, 1], jobs
    entries = projects.entries()
    holds = [{j["id"] for j in e.get("attributes", {}).get("jobs", [])} for e in entries]
    [winner] = [i for i in (0, 1) if jobs[0].id in holds[i]]
    assert entries[winner]["status"] in ("submitted", "running"), entries[winner]
    return winner


def queued_why(projects: Projects, loser: int) -> str:
    """What the loser, queued, says it waits for."""
    entry = projects.entries()[loser]
    assert entry["status"] == "pending", entry
    why = str(entry["attributes"]["queued"]["why"])
    assert WAITS in why, why
    return why


@pytest.mark.parametrize("retry", [True, False], ids=["retry-queues", "no-retry-fails"])
def test_two_projects_submitting_at_once_never_share_a_gpu(
    projects: Projects, retry: bool
) -> None:
    task = Task(**FIELDS, retry=RETRY if retry else None)

    async def both() -> list[object]:
        submits = (aapply([task], project=d) for d in projects.dirs)
        return list(await asyncio.gather(*submits, return_exceptions=True))

    raced = 0
    try:
        for number in range(ROUNDS):
            outcomes = asyncio.run(both())
            winner = one_holder(projects)
            loser = 1 - winner
            assert not isinstance(outcomes[winner], BaseException), (number, outcomes)
            if retry:
                assert not isinstance(outcomes[loser], BaseException), (number, outcomes)
                why = queued_why(projects, loser)
            else:
                failed = outcomes[loser]
                assert isinstance(failed, ApplyFailed), (number, outcomes)  # not a crash
                why = str(failed)
                assert WAITS in why and "\n" not in why, why
            raced += CONFLICT in why
            projects.destroy()
    finally:
        projects.destroy()
    print(f"{raced} of {ROUNDS} losers lost at the agent; the others planned after the winner")


@pytest.mark.parametrize("retry", [True, False], ids=["retry-queues", "no-retry-fails"])
def test_plans_saved_before_either_applied_race_at_the_agent(
    projects: Projects, retry: bool
) -> None:
    """Both saved plans place the task on the GPUs they saw free (the plan's host is tried
    first); applied at once by the CLI, the agent admits one and the other, placed again,
    names the conflict."""
    text = "type: task\nname: train\nstop_duration: 1s\ncommands: [sleep 600]\n"
    text += "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: 2}\n"
    if retry:
        text += "retry: {on_events: [no-capacity], duration: 1h}\n"
    for directory in projects.dirs:
        (directory / "train.dstack.yml").write_text(text)
    try:
        for d in projects.cli("plan", "-out", "train.plan"):
            assert d.returncode == 0 and WAITS not in d.stdout, d.stdout + d.stderr
        done = projects.cli("apply", "train.plan")
        for d in done:
            printed = d.stdout + d.stderr
            assert "Traceback" not in printed and "this is a bug" not in printed, printed
        winner = one_holder(projects)
        loser = done[1 - winner]
        assert done[winner].returncode == 0, done[winner].stdout + done[winner].stderr
        if retry:
            assert loser.returncode == 0, loser.stdout + loser.stderr
            why = queued_why(projects, 1 - winner)
        else:
            assert loser.returncode == 1, loser.stdout + loser.stderr
            why = loser.stderr.strip()
            assert len(why.splitlines()) == 1 and WAITS in why, loser.stderr
        assert why.startswith(CONFLICT) or f": {CONFLICT}; " in why, why
    finally:
        projects.destroy()
