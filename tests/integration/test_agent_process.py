"""The process runtime end to end, against a real agent process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import signal
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.client import AgentClient
from dstack_plan.errors import AgentError
from tests.infra.agent_helpers import wait_for_log
from tests.infra.agent_process import AgentProcess

FINISHED = ("done", "failed", "terminated", "aborted")
NET = 60.0
"""Seconds a test waits for a job before concluding it will not end (a safety net: a job
that behaves ends long before, and passing never waits it out)."""
NET_POLLS = 6000
"""Polls (10 ms apart, at least) before a polling loop gives up: the same safety net."""


def spec(job_id: str, *commands: str, **kwargs: Any) -> JobSpec:
    return JobSpec(id=job_id, run_name="test-run", commands=list(commands), **kwargs)


async def test_job_runs_to_done_with_logs(agent: AgentProcess) -> None:
    client = agent.client()
    info = await client.submit(spec("hello", "echo one", "echo two >&2", "echo three"))
    assert info.runtime == "process"
    assert info.status.value in ("submitted", "running", "done")
    done = await client.wait("hello", timeout=NET)
    assert (done.status.value, done.termination_reason.value, done.exit_code) == (
        "done",
        "done_by_runner",
        0,
    )
    assert done.started_at is not None and done.finished_at >= done.started_at
    chunk = await client.logs("hello")
    assert chunk.data == b"one\ntwo\nthree\n"
    assert (chunk.offset, chunk.next_offset, chunk.complete) == (0, 14, True)
    assert [j.id for j in await client.list_jobs(status="done")] == ["hello"]


async def test_nonzero_exit_is_failed_with_code(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("bad", "echo before", "exit 7", "echo never"))
    info = await client.wait("bad", timeout=NET)
    assert info.status.value == "failed"
    assert info.termination_reason.value == "container_exited_with_error"
    assert info.exit_code == 7
    assert "7" in info.termination_message
    assert (await client.read_all_logs("bad")) == b"before\n"


async def test_logs_while_running_and_across_reconnects(
    agent: AgentProcess, tmp_path: Path
) -> None:
    lines = 40
    expected = b"".join(b"line-%d\n" % i for i in range(1, lines + 1))
    release = tmp_path / "release"
    await agent.client().submit(
        spec(
            "slow",
            f"for i in $(seq 1 {lines}); do echo line-$i; sleep 0.01; done",
            # it runs on until the test has read all of it (not until some time has passed)
            f"while [ ! -e {release} ]; do sleep 0.02; done",
        )
    )
    # Small reads, each from a brand-new client (a reconnect), while the job runs.
    received = b""
    offset = 0
    saw_running = False
    for _ in range(NET_POLLS):
        reader = agent.client()
        chunk = await reader.logs("slow", offset=offset, limit=7)
        assert chunk.offset == offset and chunk.next_offset == offset + len(chunk.data)
        received += chunk.data
        offset = chunk.next_offset
        if chunk.complete:
            break
        if received == expected and not saw_running:
            # the whole output read, in pieces, while the job still runs: now let it end
            assert (await reader.get_job("slow")).status.value == "running"
            saw_running = True
            release.touch()
        await reader.aclose()
        if not chunk.data:
            await asyncio.sleep(0.01)
    assert saw_running and chunk.complete
    assert received == expected

    # Following, breaking off after a few chunks and resuming elsewhere: exact same bytes.
    follower = agent.client()
    first_part = b""
    async for chunk in follower.follow_logs("slow", offset=0):
        first_part += chunk.data
        if len(first_part) > 30:
            break
    rest = b""
    async for chunk in agent.client().follow_logs("slow", offset=len(first_part)):
        rest += chunk.data
    assert first_part + rest == expected


async def test_follow_streams_live_output(agent: AgentProcess, tmp_path: Path) -> None:
    client = agent.client()
    release = tmp_path / "release"
    await client.submit(
        spec("live", "echo start", f"while [ ! -e {release} ]; do sleep 0.02; done", "echo end")
    )
    chunks = []

    async def follow() -> None:
        async for chunk in client.follow_logs("live"):
            chunks.append(chunk.data)
            if b"".join(chunks) == b"start\n":
                # "start" came while the job runs on (it waits for the test to let it end):
                # it was streamed, not read once the job had ended
                assert (await client.get_job("live")).status.value == "running"
                release.touch()

    await asyncio.wait_for(follow(), NET)  # a follow that streams nothing never lets it end
    assert b"".join(chunks) == b"start\nend\n"
    assert release.exists()


async def test_stop_kills_a_job_ignoring_sigterm_after_the_timeout(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("stubborn", "trap '' TERM", "echo ready", "sleep 3600"))
    await wait_for_log(client, "stubborn", b"ready", timeout=NET)
    info = await client.stop("stubborn", timeout=0.5)
    assert info.status.value in ("terminating", "terminated")
    info = await client.wait("stubborn", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == (
        "terminated",
        "terminated_by_user",
    )
    assert info.exit_code == 137  # SIGKILL: the SIGTERM it ignored did not end it
    # the stop was carried out with the timeout given, and (by the agent's own record) the
    # kill came no sooner than that after the stop was asked
    stop = job_record(agent, "stubborn")["stop"]
    assert (stop["reason"], stop["timeout"]) == ("terminated_by_user", 0.5)
    assert info.finished_at is not None and info.finished_at >= stop["requested_at"] + 0.5


async def test_stop_is_graceful_for_a_cooperative_job(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("polite", "echo ready", "sleep 3600"))
    await wait_for_log(client, "polite", b"ready", timeout=NET)
    # SIGTERM is enough: the job ends long before its stop timeout (an hour: waiting it out
    # would fail the wait below), by SIGTERM, not a kill
    await client.stop("polite", timeout=3600)
    info = await client.wait("polite", timeout=NET)
    assert info.termination_reason.value == "terminated_by_user"
    assert info.exit_code == 128 + 15


async def test_a_stop_that_removes_answers_once_the_job_is_gone(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("removed", "echo ready", "sleep 3600"))
    await wait_for_log(client, "removed", b"ready", timeout=NET)
    info, removed = await client.stop_and_remove("removed", timeout=3600, reason="scaled_down")
    # one request: the job ended by SIGTERM (long before its hour) and is forgotten
    assert removed
    assert (info.status.value, info.termination_reason.value) == ("terminated", "scaled_down")
    assert info.exit_code == 128 + 15
    assert [j.id for j in await client.list_jobs()] == []
    assert not (agent.data_dir / "jobs" / "removed").exists()


async def test_a_stop_that_removes_leaves_a_job_still_stopping_to_the_caller(
    agent: AgentProcess,
) -> None:
    client = agent.client()
    await client.submit(spec("slow", "trap '' TERM", "echo ready", "sleep 3600"))
    await wait_for_log(client, "slow", b"ready", timeout=NET)
    # it ignores SIGTERM and its window is long: not held for, not removed
    info, removed = await client.stop_and_remove("slow", timeout=3600, wait=0)
    assert not removed
    assert info.status.value == "terminating"
    assert [j.id for j in await client.list_jobs()] == ["slow"]
    await client.delete("slow", force=True)
    with pytest.raises(AgentError) as gone:
        await client.stop_and_remove("slow")
    assert gone.value.status == 404


async def test_an_agent_without_remove_is_stopped_and_asked_no_more(tmp_path: Path) -> None:
    """An older agent refuses `remove` (400, nothing done): the job is stopped alone and
    the client does not ask that agent again."""
    asked: list[dict[str, Any]] = []

    async def old_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while len(asked) < 3:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
            body = json.loads(await reader.readexactly(length))
            asked.append(body)
            if set(body) - {"timeout", "abort", "reason"}:
                status, answer = b"400 Bad Request", {"error": "body: expected", "field": "body"}
            else:
                status, answer = b"202 Accepted", {**_OLD_JOB, "status": "terminating"}
            data = json.dumps(answer).encode()
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(old_agent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AgentClient(f"http://127.0.0.1:{port}", "token", retries=0)
    try:
        for _ in range(2):
            info, removed = await client.stop_and_remove("old", timeout=5)
            assert (info.status.value, removed) == ("terminating", False)
    finally:
        await client.aclose()
        server.close()
    assert asked == [
        {"remove": True, "wait": 10, "timeout": 5},
        {"abort": False, "timeout": 5},
        {"abort": False, "timeout": 5},
    ]


_OLD_JOB = {"id": "old", "run_name": "test-run", "runtime": "process", "submitted_at": 0.0}


async def test_a_wait_for_a_job_is_answered_when_it_ends(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """`GET /jobs/{id}?wait=S` holds its answer until the job has finished (a destroy asks
    once per job rather than every 100 ms); without `wait` the answer is at once."""
    client = agent.client()
    flag = tmp_path / "go"
    await client.submit(spec("held", f"while [ ! -e {flag} ]; do sleep 0.05; done"))
    assert not (await client.get_job("held")).finished
    answer = asyncio.ensure_future(client.get_job("held", wait=int(NET)))
    await asyncio.sleep(0.3)
    assert not answer.done()  # held while the job runs
    flag.touch()
    info = await asyncio.wait_for(answer, NET)
    assert info.finished and info.status.value == "done"


async def test_a_stop_carries_the_controllers_reason(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("idle", "echo ready", "sleep 60"))
    await wait_for_log(client, "idle", b"ready", timeout=NET)
    with pytest.raises(AgentError, match="reason: must be one of"):
        await client.stop("idle", reason="because")
    assert (await client.get_job("idle")).status.value == "running"  # a refused stop is none
    await client.stop("idle", timeout=5, reason="terminated_due_to_utilization_policy")
    info = await client.wait("idle", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == (
        "terminated",
        "terminated_due_to_utilization_policy",
    )
    assert info.termination_message == "GPU utilization stayed under utilization_policy"


async def test_abort_kills_at_once(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("doomed", "trap '' TERM", "echo ready", "sleep 3600"))
    await wait_for_log(client, "doomed", b"ready", timeout=NET)
    # at once: not after the stop timeout (an hour: waiting it out would fail the wait)
    await client.stop("doomed", timeout=3600, abort=True)
    info = await client.wait("doomed", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == ("aborted", "aborted_by_user")


async def test_max_duration_terminates_the_job(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("long", "echo go", "sleep 3600", max_duration=0.5, stop_timeout=3600))
    info = await client.wait("long", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == (
        "terminated",
        "max_duration_exceeded",
    )
    assert info.termination_message == "max_duration of 0.5s exceeded"
    assert info.exit_code == 128 + 15  # stopped with SIGTERM, as a user's stop is
    # and not before its time, by the agent's own record of the job
    assert info.started_at is not None and info.finished_at is not None
    assert info.finished_at >= info.started_at + 0.5


async def test_secret_env_reaches_the_job_but_never_the_disk(agent: AgentProcess) -> None:
    secret = "s3cr3t-" + secrets.token_hex(16)
    client = agent.client()
    job = spec(
        "secretive",
        'printf %s "$API_KEY" | md5sum',
        'echo "len=${#API_KEY} plain=$PLAIN"',
        env={"API_KEY": SecretStr(secret), "PLAIN": "visible"},
    )
    assert secret not in repr(job)
    await client.submit(job)
    info = await client.wait("secretive", timeout=NET)
    assert info.status.value == "done"
    logs = await client.read_all_logs("secretive")
    assert hashlib.md5(secret.encode()).hexdigest().encode() in logs
    assert f"len={len(secret)} plain=visible".encode() in logs
    assert info.spec["env"] == {"API_KEY": "(redacted)", "PLAIN": "visible"}
    assert info.spec["secret_env"] == ["API_KEY"]
    assert_nowhere(secret, agent)


def job_record(agent: AgentProcess, job_id: str) -> dict[str, Any]:
    """The agent's on-disk record of the job (`jobs/<id>/job.json`)."""
    return json.loads((agent.data_dir / "jobs" / job_id / "job.json").read_text())


def assert_nowhere(secret: str, agent: AgentProcess) -> None:
    """The secret is in no file under the data dir, nor in the agent's own log."""
    needle = secret.encode()
    for path in [*agent.data_dir.rglob("*"), agent.log_path]:
        if path.is_file():
            assert needle not in path.read_bytes(), f"secret found in {path}"


async def test_restart_fails_a_process_job_that_died_with_the_agent(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("orphan", "echo started", "sleep 60"))
    await wait_for_log(client, "orphan", b"started", timeout=NET)
    running = await client.get_job("orphan")
    agent.restart()
    client = agent.client()
    info = await client.get_job("orphan")
    assert (info.status.value, info.termination_reason.value) == ("failed", "executor_error")
    assert info.termination_message == "agent restarted while the process was running"
    assert await client.read_all_logs("orphan") == b"started\n"
    # The job's processes did not outlive it.
    for _ in range(NET_POLLS):  # a safety net: the group is killed as the agent starts
        if not _group_alive(running.pid):
            break
        await asyncio.sleep(0.01)
    assert not _group_alive(running.pid)


async def test_every_process_job_of_a_stopped_agent_says_the_agent_stopped_it(
    agent: AgentProcess,
) -> None:
    """The kill wakes each job's own thread too; whichever records the end first, the record
    names the agent's stop, not an exit code the job never chose (CI once saw -9s)."""
    client = agent.client()
    ids = [f"stopped-{i}" for i in range(20)]
    for job_id in ids:
        await client.submit(spec(job_id, "sleep 600"))
    for job_id in ids:
        for _ in range(NET_POLLS):
            if (await client.get_job(job_id)).pid:
                break
            await asyncio.sleep(0.01)
    assert agent.proc is not None
    agent.proc.terminate()
    agent.proc.wait(timeout=NET)
    for job_id in ids:
        record = json.loads(_read(agent.data_dir / "jobs" / job_id / "job.json"))
        assert (record["status"], record["termination_message"]) == (
            "failed",
            "agent stopped while the process was running",
        ), job_id


async def test_a_stopping_agent_ends_every_process_before_recording_any(
    agent: AgentProcess,
) -> None:
    """With thousands of jobs the records outlast `agent stop`'s grace period, after which
    the agent is killed: the jobs must all be gone by the first record, not one by one."""
    client = agent.client()
    ids = [f"many-{i}" for i in range(60)]
    for job_id in ids:
        await client.submit(spec(job_id, "sleep 600"))
    pids: list[int] = []
    for job_id in ids:
        for _ in range(NET_POLLS):
            info = await client.get_job(job_id)
            if info.pid:
                pids.append(info.pid)
                break
            await asyncio.sleep(0.01)
    assert len(pids) == len(ids)
    assert agent.proc is not None
    agent.proc.terminate()
    # The agent is killed the moment one record says it ended, as a stop's SIGKILL might.
    records = [agent.data_dir / "jobs" / job_id / "job.json" for job_id in ids]
    recorded = False
    for _ in range(NET_POLLS):
        exited = agent.proc.poll() is not None
        # read after the look at the process: an agent that records and exits between a
        # read and that look has still recorded (a loaded machine hit that window)
        recorded = any(b"agent stopped while" in _read(r) for r in records)
        if recorded or exited:
            break
        await asyncio.sleep(0.001)
    agent.kill()
    assert recorded, "the agent exited without recording a job's end"
    assert _running_in_groups(set(pids)) == []


async def test_more_process_jobs_than_the_inherited_open_files_limit_run(
    tmp_path: Path,
) -> None:
    """An agent started with a low soft limit (a service's or a login's 1,024) raises it
    to its hard limit: each process job holds its log and a pipe, and more jobs than the
    soft limit start and run (18 of these did before)."""
    soft_limit = 64
    agent = AgentProcess(tmp_path / "agent")
    agent.command = [
        "/bin/sh",
        "-c",
        f'ulimit -S -n {soft_limit} && exec "$@"',
        "sh",
        *agent.command,
    ]
    agent.start()
    try:
        client = agent.client()
        ids = [f"fd-{i}" for i in range(soft_limit + 16)]
        for job_id in ids:
            await client.submit(spec(job_id, "echo up", "sleep 600"))
        for job_id in ids:
            await wait_for_log(client, job_id, b"up", timeout=NET)
        statuses = {j.id: j.status.value for j in await client.list_jobs()}
        assert statuses == {job_id: "running" for job_id in ids}
        with open(f"/proc/{agent.info['pid']}/limits") as f:
            line = next(x for x in f if x.startswith("Max open files"))
        assert int(line.split()[3]) > soft_limit
    finally:
        agent.kill(signal.SIGTERM)


def _running_in_groups(pgids: set[int]) -> list[int]:
    """Processes of these process groups that have not exited (a killed job whose parent
    died is a zombie until init reaps it: it counts as gone)."""
    running = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(Path("/proc", entry, "stat"))
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) in pgids:
            running.append(int(entry))
    return running


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _group_alive(pgid: int | None) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


async def test_gpus_are_allocated_exclusively_and_freed(
    agent_factory: Any, fake_gpu_bin: Path
) -> None:
    agent = agent_factory(extra_path=fake_gpu_bin)
    client = agent.client()
    facts = await client.host_facts()
    assert [(g.index, g.name, g.memory_mib, g.uuid) for g in facts.gpus] == [
        (0, "NVIDIA Fake A100", 81920, "GPU-fake-0"),
        (1, "NVIDIA Fake A100", 81920, "GPU-fake-1"),
    ]
    for name in ("g1", "g2"):
        await client.submit(spec(name, 'echo "gpus=$CUDA_VISIBLE_DEVICES"', "sleep 60", gpus=1))
    seen = set()
    for name in ("g1", "g2"):
        logs = await wait_for_log(client, name, b"gpus=", timeout=NET)
        seen.add(logs.decode().strip())
    assert seen == {"gpus=0", "gpus=1"}

    with pytest.raises(AgentError) as refused:
        await client.submit(spec("g3", "echo never", gpus=1))
    assert refused.value.status == 409
    assert "asked for 1 GPU" in str(refused.value) and "free indices: none" in str(refused.value)
    metrics = await client.metrics()
    assert 'dstack_agent_gpu_utilization_percent{gpu="0"} 37' in metrics
    assert 'dstack_agent_gpu_allocated{gpu="1",job="g2"} 1' in metrics or (
        'dstack_agent_gpu_allocated{gpu="1",job="g1"} 1' in metrics
    )

    holder = (await client.get_job("g1")).gpus
    await client.stop("g1", timeout=1)
    await client.wait("g1", timeout=NET)
    await client.submit(spec("g3", 'echo "gpus=$CUDA_VISIBLE_DEVICES"', gpus=1))
    await client.wait("g3", timeout=NET)
    assert await client.read_all_logs("g3") == f"gpus={holder[0]}\n".encode()
    # A job that asks for no GPU on a GPU host sees none.
    await client.submit(spec("g0", 'echo "gpus=[$CUDA_VISIBLE_DEVICES]"'))
    await client.wait("g0", timeout=NET)
    assert await client.read_all_logs("g0") == b"gpus=[]\n"


async def test_rotation_caps_the_log_and_says_so(agent_factory: Any) -> None:
    agent = agent_factory(log_max_bytes=4096)
    client = agent.client()
    # 300 lines of 100 bytes = 30000 bytes, far over the 4096-byte cap.
    line = "x" * 95
    await client.submit(spec("chatty", f'for i in $(seq 1000 1299); do echo "$i {line}"; done'))
    info = await client.wait("chatty", timeout=NET)
    assert info.status.value == "done"
    assert info.logs_truncated and info.log_first_offset > 0
    assert info.log_size >= 30000  # offsets count everything ever written
    assert info.log_size - info.log_first_offset <= 4096 + 1024
    chunk = await client.logs("chatty", offset=0)
    assert chunk.truncated and chunk.offset == info.log_first_offset
    assert chunk.next_offset == info.log_size and chunk.complete
    expected = "".join(f"{i} {line}\n" for i in range(1000, 1300)).encode()
    pieces = re.split(
        rb"\n?\[dstack-plan agent\] log limit of 4096 bytes reached[^\n]*\n", chunk.data
    )
    assert len(pieces) > 1  # at least one marker line
    assert expected.endswith(pieces[-1]) and all(p in expected for p in pieces)
    assert f"1299 {line}".encode() in chunk.data


async def test_bad_working_dir_fails_with_executor_error(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(spec("nowhere", "true", working_dir="/nonexistent/dir"))
    info = await client.wait("nowhere", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == ("failed", "executor_error")
    assert "/nonexistent/dir" in info.termination_message
