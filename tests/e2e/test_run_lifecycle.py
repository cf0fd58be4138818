"""Runs through their life on the local fleet, through the CLI, with a real agent: stopping,
failing under --attach, vanishing from the agent (drift), dev environments that stay up,
following logs, and --target / --replace on apply and destroy."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from dstack_plan.agent.client import AgentClient
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status

RESOURCES = "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}\n"


def task(name: str, *commands: str) -> str:
    listed = "".join(f"  - {json.dumps(c)}\n" for c in commands)
    return f"type: task\nname: {name}\ncommands:\n{listed}{RESOURCES}"


def job_pids(agent_dir: Path) -> list[int]:
    records = [json.loads(p.read_text()) for p in (agent_dir / "jobs").glob("*/job.json")]
    return [r["pid"] for r in records if r.get("pid")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stop_ends_a_service_which_stays_stopped_until_replaced(
    dstack: Dstack, tmp_path: Path
) -> None:
    (tmp_path / "project" / "svc.dstack.yml").write_text(
        "type: service\nname: web\nport: 18932\ncommands: ['exec sleep 300']\n"
        f"stop_duration: 2s\n{RESOURCES}"
    )
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "service.web", {"running"})
    pids = job_pids(tmp_path / "agent")
    assert pids and all(alive(p) for p in pids)

    refused = dstack("stop", "web")  # no terminal: -y is required
    assert refused.returncode == 1 and "needs confirmation" in refused.stderr
    stopped = dstack("stop", "web", "-y")
    assert stopped.returncode == 0, stopped.stderr
    assert "Stopped service.web (1 job)" in stopped.stdout
    assert not any(alive(p) for p in pids)
    assert state(tmp_path / "project")["resources"]["service.web"]["status"] != "running"

    # a stopped run stays finished, like a finished task: nothing to do until asked
    again = dstack("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    restarted = dstack("apply", "-y", "--replace", "service.web")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    wait_for_status(dstack, "service.web", {"running"})
    assert dstack("destroy", "-y").returncode == 0


def test_attach_exits_non_zero_when_a_run_fails(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "t.dstack.yml").write_text(
        task("broken", "echo about to fail", "exit 3")
    )
    result = dstack("apply", "-y", "--attach")
    assert result.returncode == 1, result.stdout
    assert "about to fail" in result.stdout
    assert ": failed (exit code 3)" in result.stderr
    row = wait_for_status(dstack, "task.broken", {"failed"})
    assert row["failure"] == "container_exited_with_error: exited with code 3"
    listed = dstack("ps", "-a")
    assert f"! task.broken failed: {row['failure']}" in listed.stdout, listed.stdout


def test_a_run_gone_from_its_agent_is_planned_again(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "t.dstack.yml").write_text(task("hello", "echo hi"))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.hello", {"done"})
    assert dstack("plan", "--detailed-exitcode").returncode == 0

    job_ids = [
        j["id"]
        for j in state(tmp_path / "project")["resources"]["task.hello"]["attributes"]["jobs"]
    ]

    async def forget() -> None:
        async with AgentClient.from_data_dir(tmp_path / "agent") as agent:
            for job_id in job_ids:
                await agent.delete(job_id, force=True)

    asyncio.run(forget())
    drift = dstack("plan", "--detailed-exitcode")
    assert drift.returncode == 2, drift.stdout + drift.stderr
    assert "drift" in drift.stdout and 'task "hello"' in drift.stdout
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "task.hello", {"done"})
    assert dstack("plan", "--detailed-exitcode").returncode == 0


def test_a_dev_environment_runs_its_init_and_stays_up(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "dev.dstack.yml").write_text(
        f"type: dev-environment\nname: dev\nide: vscode\ninit:\n  - echo init ran\n{RESOURCES}"
    )
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "dev-environment.dev", {"running"})
    deadline = time.monotonic() + 10
    while "init ran" not in (logs := dstack("logs", "dev").stdout):
        assert time.monotonic() < deadline, logs
        time.sleep(0.2)
    time.sleep(1.5)
    assert wait_for_status(dstack, "dev-environment.dev", {"running"}, timeout=1)
    assert dstack("destroy", "-y").returncode == 0


def test_logs_follow_until_the_run_ends(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "t.dstack.yml").write_text(
        task("slow", "echo first", "sleep 1.5", "echo second", "sleep 1.5", "echo third")
    )
    assert dstack("apply", "-y").returncode == 0
    followed = dstack("logs", "-f", "slow", timeout=60)
    assert followed.returncode == 0, followed.stderr
    # "third" is printed 3 s after the run starts: only a follow that waited for the end has it
    assert followed.stdout.split() == ["first", "second", "third"]


def test_target_and_replace_on_apply_and_destroy(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "a.dstack.yml").write_text(task("alpha", "echo a"))
    (project / "b.dstack.yml").write_text(task("beta", "echo b"))

    only_a = dstack("apply", "-y", "--target", "task.alpha")
    assert only_a.returncode == 0, only_a.stdout + only_a.stderr
    assert "Resource targeting is in effect" in only_a.stdout
    assert list(state(project)["resources"]) == ["task.alpha"]

    assert dstack("apply", "-y").returncode == 0
    first = state(project)["resources"]["task.alpha"]["attributes"]["generation"]
    replaced = dstack("apply", "-y", "--replace", "task.alpha")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert "will be replaced, as requested" in replaced.stdout
    assert "Resources: 1 added, 0 changed, 1 destroyed." in replaced.stdout
    assert state(project)["resources"]["task.alpha"]["attributes"]["generation"] != first

    gone_b = dstack("destroy", "-y", "--target", "task.beta")
    assert gone_b.returncode == 0, gone_b.stdout + gone_b.stderr
    assert sorted(state(project)["resources"]) == ["task.alpha"]
    assert dstack("destroy", "-y").returncode == 0
    assert state(project)["resources"] == {}


def start_replaceable_service(dstack: Dstack, tmp_path: Path, port: int) -> tuple[Path, int]:
    """A running service under create_before_destroy: its config file and its process."""
    config = tmp_path / "project" / "svc.dstack.yml"
    config.write_text(
        f"type: service\nname: web\nport: {port}\ncommands: ['exec sleep 300']\n"
        f"stop_duration: 1s\nlifecycle: {{create_before_destroy: true}}\n{RESOURCES}"
    )
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "service.web", {"running"})
    (pid,) = job_pids(tmp_path / "agent")
    return config, pid


def test_create_before_destroy_keeps_the_new_service_running(
    dstack: Dstack, tmp_path: Path
) -> None:
    config, old_pid = start_replaceable_service(dstack, tmp_path, port=18934)

    config.write_text(config.read_text().replace("sleep 300", "sleep 301"))
    replaced = dstack("apply", "-y")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert "+/- service" in replaced.stdout and "Destroying deposed object" in replaced.stdout
    row = wait_for_status(dstack, "service.web", {"running"})
    assert len(row["jobs"]) == 1
    (new_pid,) = job_pids(tmp_path / "agent")
    assert new_pid != old_pid and alive(new_pid) and not alive(old_pid)
    assert dstack("plan", "--detailed-exitcode").returncode == 0
    assert dstack("destroy", "-y").returncode == 0
    assert not alive(new_pid)


def test_a_run_no_machine_can_take_fails_to_apply(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / "t.dstack.yml").write_text(
        task("big", "echo should not run").replace("memory: 0.1GB..", "memory: 100000GB..")
    )
    planned = dstack("plan", "--json")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert "task.big cannot run on any fleet: local (" in planned.stderr
    assert "needs 100000GB.. memory, machine has" in planned.stderr
    applied = dstack("apply", "-y")  # refused by its plan, before anything starts
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert "task.big cannot run on any fleet" in applied.stderr
    jobs = tmp_path / "agent" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())


def test_stop_also_ends_what_a_failed_replacement_left_running(
    dstack: Dstack, tmp_path: Path
) -> None:
    config, old_pid = start_replaceable_service(dstack, tmp_path, port=18936)

    # the replacement cannot start (an env variable without a value): the old object stays,
    # deposed, and keeps running
    config.write_text(config.read_text() + "env: [DSTACK_PLAN_TEST_UNSET_VARIABLE]\n")
    assert dstack("apply", "-y").returncode == 1
    entry = state(tmp_path / "project")["resources"]["service.web"]
    assert entry["tainted"] and len(entry["attributes"]["_deposed"]) == 1
    assert alive(old_pid)

    stopped = dstack("stop", "web", "-y")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not alive(old_pid)
    assert dstack("destroy", "-y").returncode == 0
