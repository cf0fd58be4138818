"""How lean a process job is, against a real agent: one whose one command is a plain program
call runs without a shell (the job's process is the program itself: one pid a job, not two),
gets what the shell would have given it, and a command the kernel cannot execute still runs
as the shell runs it; and the agent watches each job's exit and output on a pidfd of its own,
from one thread, the output of a process that outlives the job read on.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from dstack_plan.agent.api_models import JobInfo, JobSpec
from dstack_plan.agent.client import AgentClient
from tests.infra.agent_helpers import wait_for_status
from tests.infra.agent_process import AgentProcess

NET = 60.0
"""Seconds a test waits for a job before concluding it will not end (a safety net)."""


def spec(job_id: str, *commands: str, **kwargs: Any) -> JobSpec:
    return JobSpec(id=job_id, run_name="test-run", commands=list(commands), **kwargs)


async def started(client: AgentClient, job_id: str) -> JobInfo:
    """The job once it runs (the agent records its pid as it marks it running)."""
    return await wait_for_status(client, job_id, ("running",), timeout=NET)


def program_of(pid: int) -> str:
    return os.path.basename(os.readlink(f"/proc/{pid}/exe"))


async def test_a_plain_command_is_the_jobs_own_process(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("plain", "sleep 60"))
    await client.submit(spec("shelled", "sleep 60 && true"))
    plain, shelled = await started(client, "plain"), await started(client, "shelled")
    assert plain.pid and shelled.pid
    assert program_of(plain.pid) == "sleep"
    assert Path(f"/proc/{plain.pid}/cmdline").read_bytes() == b"sleep\x0060\x00"
    assert program_of(shelled.pid) in ("dash", "sh", "bash", "busybox")
    for job_id in ("plain", "shelled"):  # a stop reaches the program either way
        await client.stop(job_id, timeout=5)
        info = await client.wait(job_id, timeout=NET)
        assert info.status.value == "terminated", info


async def test_a_direct_job_gets_its_working_dir_and_every_env_name(
    agent: AgentProcess, tmp_path: Path
) -> None:
    client = agent.client()
    env = {"MY-VAR": "x", "PWD": "/somewhere/else"}
    await client.submit(spec("envs", "env", working_dir=str(tmp_path), env=env))
    info = await client.wait("envs", timeout=NET)
    lines = (await client.read_all_logs("envs")).decode().splitlines()
    assert (info.status.value, info.exit_code) == ("done", 0), lines
    # the shell would have exported PWD as the directory it runs in; bash keeps `MY-VAR`
    assert f"PWD={tmp_path}" in lines and "MY-VAR=x" in lines


async def test_a_script_without_interpreter_line_still_runs_under_the_shell(
    agent: AgentProcess, tmp_path: Path
) -> None:
    script = tmp_path / "steps"
    script.write_text('echo "ran $1"\n')  # no `#!`: the kernel refuses it, the shell runs it
    script.chmod(0o755)
    client = agent.client()
    await client.submit(spec("script", "./steps fine", working_dir=str(tmp_path)))
    info = await client.wait("script", timeout=NET)
    assert (info.status.value, info.exit_code) == ("done", 0), info
    assert await client.read_all_logs("script") == b"ran fine\n"


async def test_a_missing_program_fails_as_the_shell_reports_it(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("missing", "no-such-program-here --help"))
    info = await client.wait("missing", timeout=NET)
    assert (info.status.value, info.exit_code) == ("failed", 127)
    assert b"not found" in await client.read_all_logs("missing")


def pidfds_of(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    links = []
    for fd in fds.iterdir():
        try:
            links.append(os.readlink(fd))
        except FileNotFoundError:  # closed meanwhile
            pass
    return links.count("anon_inode:[pidfd]")


async def test_each_running_process_job_is_watched_on_a_pidfd_by_one_thread(
    agent: AgentProcess,
) -> None:
    """A job's thread waits on a pidfd of its own, not in the agent's shared `waitpid`
    queue that every exit walks (`runtimes/child_exit.py`), and reads the job's output in
    the same wait: no second thread a job. The pidfd goes with the job."""
    assert agent.proc is not None
    client = agent.client()
    threads = len(os.listdir(f"/proc/{agent.proc.pid}/task"))
    for name in ("w0", "w1", "w2"):
        await client.submit(spec(name, "sleep 60"))
    for name in ("w0", "w1", "w2"):
        await started(client, name)
    assert pidfds_of(agent.proc.pid) == 3
    # one thread a job (+3); two a job would be +6 (the margin: a request's thread)
    assert len(os.listdir(f"/proc/{agent.proc.pid}/task")) < threads + 6
    for name in ("w0", "w1", "w2"):
        await client.stop(name, timeout=5)
    for name in ("w0", "w1", "w2"):
        assert (await client.wait(name, timeout=NET)).status.value == "terminated"
    assert pidfds_of(agent.proc.pid) == 0


async def test_a_process_that_left_the_job_writes_on_unhindered(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """The job ends with its main process, within the drain bound (5 s), though a process
    it started in a session of its own still holds the output pipe; that process is not cut
    off: its later writes do not fail (the pipe is still read), so it runs on."""
    client = agent.client()
    up, go, wrote = tmp_path / "up", tmp_path / "go", tmp_path / "wrote"
    waiter = f"touch {up}; while [ ! -e {go} ]; do sleep 0.05; done; echo late; touch {wrote}"
    # the job ends once the other process is in its own session (before, the end of the
    # job's group would take it along)
    command = f"setsid sh -c '{waiter}' & while [ ! -e {up} ]; do sleep 0.05; done; echo early"
    await client.submit(spec("leaver", command))
    info = await client.wait("leaver", timeout=NET)
    assert (info.status.value, info.exit_code) == ("done", 0)
    assert await client.read_all_logs("leaver") == b"early\n"
    go.touch()
    for _ in range(int(NET / 0.05)):  # a safety net: the file comes right after the write
        if wrote.exists():
            break
        await asyncio.sleep(0.05)
    assert wrote.exists()  # a write to a closed pipe would have killed it (SIGPIPE)
