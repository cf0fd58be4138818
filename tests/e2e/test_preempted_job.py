"""A job stopped as `preempted` on the local fleet, with a real agent and the run's own watch
on a fake clock, ticked by hand: the stop gives the job SIGTERM and its grace (it writes its
checkpoint), a run whose retry covers `interruption` goes back to `pending` and is placed
again (its new job resumes from the checkpoint), and a run without such a retry ends
`terminated` with the reason `preempted`. Both for a process job and a job in a container."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobStatus, TerminationReason
from dstack_plan.agent.client import AgentClient
from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.state.events import EventLog
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_watch_limits import only_job

RETRY = "retry: {on_events: [interruption], duration: 1h}\n"
GRACE = 30.0
"""The run's `stop_duration`, and the timeout the preempting stop gives."""
WAIT = 90.0
"""Generous bounds for what takes real time (a job starting, ending, writing its log)."""


def checkpointed(name: str, ckpt: str, extra: str) -> str:
    """A task that, on SIGTERM, writes its checkpoint and exits 0; started again, says what
    it resumes from. `ready` once its trap is set (a stop before that would find none)."""
    script = (
        f"trap 'echo 7 > {ckpt}; exit 0' TERM; "
        f"if [ -f {ckpt} ]; then echo resumed-from-$(cat {ckpt}); fi; "
        "echo ready; sleep 600 & wait"
    )
    return (
        f"type: task\nname: {name}\ncommands: [{json.dumps(script)}]\n"
        f"stop_duration: {GRACE:g}s\n{extra}{RESOURCES}"
    )


async def log_of(client: AgentClient, job_id: str) -> str:
    return (await client.logs(job_id)).data.decode(errors="replace")


async def wait_log(client: AgentClient, job_id: str, text: str) -> str:
    deadline = time.monotonic() + WAIT
    while True:
        log = await log_of(client, job_id)
        if text in log:
            return log
        assert time.monotonic() < deadline, f"{job_id} never wrote {text!r}: {log!r}"
        await asyncio.sleep(0.2)


def entry(project: Path, address: str) -> dict[str, Any]:
    return dict(state(project)["resources"][address])


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def runtime(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(the runtime's name, what the tasks add for it)."""
    if request.param == "process":
        return "process", ""
    from tests.infra.docker_images import ensure_busybox_image

    image = ensure_busybox_image(request.getfixturevalue("docker_client"))
    return "docker", f"image: {image}\n"


def test_a_preempted_job_checkpoints_and_its_run_restarts_only_when_retry_covers_it(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, runtime: tuple[str, str]
) -> None:
    kind, extra = runtime
    project = tmp_path / "project"
    ckpts = {name: tmp_path / f"ckpt-{name}" for name in ("resumable", "plain")}
    for name, directory in ckpts.items():
        directory.mkdir()
        directory.chmod(0o777)  # whoever the job runs as writes its checkpoint there
        if kind == "docker":  # the container sees the directory at /ckpt
            path, more = "/ckpt/CKPT", f"{extra}volumes: ['{directory}:/ckpt']\n"
        else:
            path, more = str(directory / "CKPT"), ""
        more += RETRY if name == "resumable" else ""
        (project / f"{name}.dstack.yml").write_text(checkpointed(name, path, more))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for name in ckpts:
        wait_for_status(dstack, f"task.{name}", {"running"}, timeout=WAIT)
    first = {name: only_job(project, f"task.{name}") for name in ckpts}
    asyncio.run(_scenario(dstack, project, agent_dir, kind, ckpts, first))
    assert dstack("destroy", "-y").returncode == 0


async def _scenario(
    dstack: Dstack,
    project: Path,
    agent_dir: Path,
    kind: str,
    ckpts: dict[str, Path],
    first: dict[str, str],
) -> None:
    client = AgentClient.from_data_dir(agent_dir)
    for job_id in first.values():
        assert "resumed-from" not in await wait_log(client, job_id, "ready")

    # preempted as the owner's watch does it: SIGTERM, the run's stop_duration, then kill
    ended = {}
    for job_id in first.values():
        stopping = await client.stop(job_id, timeout=GRACE, reason="preempted")
        assert stopping.runtime == kind
        assert stopping.status in (JobStatus.TERMINATING, JobStatus.TERMINATED)
    for name, job_id in first.items():
        info = await client.wait(job_id, timeout=WAIT)
        assert info.status is JobStatus.TERMINATED, info
        assert info.termination_reason is TerminationReason.PREEMPTED, info
        assert info.exit_code == 0, info  # its trap ran: it exited by itself, not killed
        assert (ckpts[name] / "CKPT").read_text() == "7\n"  # the checkpoint it got to write
        assert info.finished_at is not None
        ended[name] = info.finished_at

    # the run's own watch, its clock just after the jobs ended (the agent's times are real)
    clock = FakeClock(max(ended.values()) + 1)
    watched = Project(project, agent_dir=agent_dir, clock=clock)
    watcher = Watcher(watched, events=EventLog(watched.backend))
    try:
        await watcher.tick()
        resumable, plain = entry(project, "task.resumable"), entry(project, "task.plain")
        # covered: back to pending, placed again once the first backoff step (15 s) is over
        assert resumable["status"] == "pending", resumable
        assert resumable["attributes"]["jobs"][0]["id"] == first["resumable"]
        retry = resumable["attributes"]["retry"]
        assert retry["last_event"] == "interruption" and retry["last_reason"] == "preempted"
        assert retry["next_attempt_at"] == ended["resumable"] + 15
        assert "termination_reason" not in resumable["attributes"]
        # not covered: ends terminated, as preempted
        assert plain["status"] == "terminated", plain
        assert plain["attributes"]["termination_reason"] == "preempted"

        await watcher.tick()  # the backoff is not over: it waits, as it was
        assert entry(project, "task.resumable")["status"] == "pending"

        clock.advance(15)
        await watcher.tick()
        second = only_job(project, "task.resumable")
        assert second != first["resumable"]  # placed again
        deadline = time.monotonic() + WAIT
        while (status := entry(project, "task.resumable")["status"]) != "running":
            assert status in ("submitted", "pulling"), status
            assert time.monotonic() < deadline, f"task.resumable never ran again: {status}"
            await asyncio.sleep(0.2)
            clock.advance(1)
            await watcher.tick()
        # the new job found the checkpoint its predecessor wrote on SIGTERM
        assert (await wait_log(client, second, "ready")).startswith("resumed-from-7\n")

        clock.advance(600)
        await watcher.tick()  # the run without retry is never placed again
        plain = entry(project, "task.plain")
        assert plain["status"] == "terminated"
        assert plain["attributes"]["termination_reason"] == "preempted"
        assert only_job(project, "task.plain") == first["plain"]
    finally:
        await watched.close()

    logs = dstack("logs", "resumable")
    assert logs.returncode == 0 and "resumed-from-7" in logs.stdout, logs.stdout + logs.stderr
    out = dstack("events", "--json")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    for name, job_id in first.items():
        (stopped,) = [
            e for e in events if e["job_id"] == job_id and e["new_status"] == "terminated"
        ]
        assert stopped["kind"] == "job" and stopped["address"] == f"task.{name}"
        assert stopped["reason"].startswith("preempted"), stopped
    runs = [(e["address"], e["new_status"], e["reason"]) for e in events if e["kind"] == "run"]
    assert ("task.resumable", "pending", None) in runs, runs
    assert ("task.resumable", "running", None) in runs, runs
    assert ("task.plain", "terminated", "preempted") in runs, runs
    assert ("task.plain", "pending", None) not in runs, runs  # never retried
