"""The agent's HTTP surface: bad input, auth, idempotency, and the detaching daemon commands."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dstack_plan.agent import daemon
from dstack_plan.agent.api_models import JobSpec, PortMapping
from dstack_plan.agent.client import AgentClient
from dstack_plan.agent.daemon import self_command
from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.liveness import read_pid
from dstack_plan.errors import AgentError
from tests.conftest import REPO_ROOT
from tests.infra.agent_helpers import wait_for_status
from tests.infra.agent_process import AgentProcess
from tests.infra.recording_clock import RecordingClock


def raw(agent: AgentProcess, token: str | None = "good") -> httpx.AsyncClient:
    headers = {}
    if token == "good":
        headers["Authorization"] = f"Bearer {agent.token}"
    elif token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(base_url=agent.url, headers=headers, trust_env=False, timeout=60)


async def test_bad_requests_get_clear_errors_and_the_agent_keeps_serving(
    agent: AgentProcess,
) -> None:
    client = agent.client()
    async with raw(agent) as http:
        r = await http.post("/jobs", content=b'{"id": "x", "run_name": ')
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "malformed_json"
        assert "malformed JSON" in r.json()["error"]["message"]

        r = await http.post("/jobs", json=["not", "an", "object"])
        assert r.status_code == 400 and "must be a JSON object" in r.json()["error"]["message"]

        r = await http.post("/jobs", json={"run_name": "r", "commands": ["true"], "colour": 1})
        assert r.status_code == 400 and r.json()["error"]["field"] == "colour"

        r = await http.post("/jobs", content=b"x" * (5 * 1024 * 1024))
        assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

        r = await http.get("/nope")
        assert r.status_code == 404
        r = await http.put("/jobs")
        assert r.status_code == 405

    async with raw(agent, token=None) as http:
        r = await http.get("/health")
        assert r.status_code == 401 and "missing bearer token" in r.json()["error"]["message"]
        assert r.headers["WWW-Authenticate"] == "Bearer"
    async with raw(agent, token="wrong") as http:
        r = await http.get("/jobs")
        assert r.status_code == 401 and "invalid bearer token" in r.json()["error"]["message"]
    wrong = AgentClient(agent.url, "nope", retries=0)
    with pytest.raises(AgentError) as e:
        await wrong.health()
    assert e.value.status == 401

    for call in (client.get_job("ghost"), client.logs("ghost"), client.stop("ghost")):
        with pytest.raises(AgentError) as e:
            await call
        assert e.value.status == 404 and "ghost" in str(e.value)

    with pytest.raises(AgentError) as e:
        await client.submit(JobSpec(run_name="r", commands=["nvidia-smi"], gpus=4))
    assert e.value.status == 422
    assert "asked for 4 GPUs but this host has 0" in str(e.value)

    with pytest.raises(AgentError) as e:
        await client.submit(JobSpec(run_name="r", image="busybox; rm -rf /", commands=["true"]))
    assert e.value.status in (400, 422)
    assert "image" in str(e.value)
    async with raw(agent) as http:
        r = await http.post(
            "/jobs", json={"run_name": "r", "image": "busybox$(reboot)", "commands": ["true"]}
        )
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["field"] == "image" and "'$'" in error["message"]

    with pytest.raises(AgentError) as e:
        await client.submit(
            JobSpec(run_name="r", commands=["true"], env={"BIG": "v" * 200_000, "OK": "1"})
        )
    assert e.value.status == 400
    assert "env.BIG: is 200000 bytes; the limit is 65536" in str(e.value)

    with pytest.raises(AgentError) as e:
        await client.submit(
            JobSpec(
                run_name="r", commands=[], volumes=[{"host_path": "/a", "container_path": "b"}]
            )
        )
    message = str(e.value)
    assert "commands:" in message and "volumes" in message  # every problem, in one answer

    assert (await client.health()).status == "ok"
    assert await client.list_jobs() == []


async def test_submit_is_idempotent_per_id(agent: AgentProcess) -> None:
    client = agent.client()
    job = JobSpec(id="same", run_name="r", commands=["sleep 30"])
    first = await client.submit(job)
    again = await client.submit(job)
    assert again.id == first.id and again.submitted_at == first.submitted_at
    with pytest.raises(AgentError) as e:
        await client.submit(JobSpec(id="same", run_name="r", commands=["echo other"]))
    assert e.value.status == 409
    assert len(await client.list_jobs()) == 1

    with pytest.raises(AgentError) as e:
        await client.delete("same")
    assert e.value.status == 409 and "stop it first" in str(e.value)
    await client.delete("same", force=True)
    with pytest.raises(AgentError) as e:
        await client.get_job("same")
    assert e.value.status == 404
    assert not (agent.data_dir / "jobs" / "same").exists()


async def test_a_host_port_an_unfinished_job_binds_is_refused_until_it_ends(
    agent: AgentProcess,
) -> None:
    """Two projects placing on one host at one moment both saw port 18301 free: the agent
    admits the first and answers the second 409 `ports_unavailable`, naming the port and the
    job holding it; once that job has ended the port is free again."""
    client = agent.client()
    port = [PortMapping(container_port=18301)]
    await client.submit(JobSpec(id="first", run_name="a", commands=["sleep 30"], ports=port))
    with pytest.raises(AgentError) as e:
        await client.submit(JobSpec(id="second", run_name="b", commands=["sleep 30"], ports=port))
    assert (e.value.status, e.value.code) == (409, "ports_unavailable")
    assert "18301 (job first)" in str(e.value)
    other = [PortMapping(container_port=18302)]
    await client.submit(JobSpec(id="third", run_name="c", commands=["sleep 30"], ports=other))
    # the same run's next generation (a create-before-destroy replacement) is its own to order
    run = {"deployment": "d1", "address": "service.web"}
    mine = [PortMapping(container_port=18303)]
    for job in ("web-old", "web-new"):
        spec = JobSpec(id=job, run_name="web", commands=["sleep 30"], ports=mine, labels=run)
        await client.submit(spec)
    await client.stop("first", timeout=0)
    await client.delete("first", force=True)
    await client.submit(JobSpec(id="second", run_name="b", commands=["sleep 30"], ports=port))
    for job in ("second", "third", "web-old", "web-new"):
        await client.delete(job, force=True)


async def test_client_gives_up_after_bounded_retries() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clock = RecordingClock()
    client = AgentClient(
        f"http://127.0.0.1:{port}", "t", retries=2, retry_delay=5, clock=clock, timeout=3600
    )
    with pytest.raises(AgentError) as e:
        await client.health()
    await client.aclose()
    assert "after 3 attempt(s)" in str(e.value) and e.value.host == f"127.0.0.1:{port}"
    # each attempt ended on the refusal, not on a timeout (an hour here), and between them
    # the client waited its backoff (on its clock: 5 s, then twice that) and nothing more
    assert "refused" in str(e.value).lower(), e.value
    assert clock.sleeps == [5, 10]


async def test_client_over_a_custom_connection(agent: AgentProcess) -> None:
    # What an SSH channel provides: a reader/writer pair opened by a function of ours.
    opened: list[str] = []
    host, port = agent.url.removeprefix("http://").rsplit(":", 1)

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        opened.append("channel")
        return await asyncio.open_connection(host, int(port))

    client = agent.client(connect=connect, host="gpu-host-1")
    assert (await client.health()).version
    with pytest.raises(AgentError) as e:
        await client.get_job("ghost")
    assert e.value.host == "gpu-host-1" and e.value.status == 404
    assert opened == ["channel"]  # kept open for the second request
    await client.aclose()


def agent_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dstack_plan.agent", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=check,
    )


async def test_start_status_stop_detach_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "agent"
    try:
        first = json.loads(agent_cli("start", "--data-dir", str(data_dir)).stdout)
        assert first["already_running"] is False and first["host"] == "127.0.0.1"
        token_file = Path(first["token_file"])
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700

        second = json.loads(agent_cli("start", "--data-dir", str(data_dir)).stdout)
        assert second["already_running"] is True and second["pid"] == first["pid"]

        status = agent_cli("status", "--data-dir", str(data_dir))
        assert json.loads(status.stdout)["running"] is True

        async with AgentClient.from_data_dir(data_dir) as client:
            assert (await client.health()).agent_id == first["agent_id"]
        _assert_loopback_only(first["port"])

        serve = agent_cli("serve", "--data-dir", str(data_dir), check=False)
        assert serve.returncode == 1 and "already serves" in serve.stderr

        assert agent_cli("stop", "--data-dir", str(data_dir)).stdout.strip() == "stopped"
        assert not _alive(first["pid"])  # gone when stop returns, not just its lock let go
        status = agent_cli("status", "--data-dir", str(data_dir), check=False)
        assert status.returncode == 3 and json.loads(status.stdout)["running"] is False
        assert "no agent runs" in agent_cli("stop", "--data-dir", str(data_dir)).stdout
    finally:
        agent_cli("stop", "--data-dir", str(data_dir), check=False)


def test_start_finds_an_agent_still_starting_for_a_caller_that_died(tmp_path: Path) -> None:
    """A killed `dstack apply` can leave the agent it spawned still importing: the next start
    spawns another, which loses the serve lock, and must answer with the first agent."""
    data = DataDir(tmp_path / "agent")
    data.ensure()
    with open(data.log_file, "ab") as log_file:
        orphan = subprocess.Popen(
            [*self_command(), "serve", "--data-dir", str(data.root), "--port", "0"],
            stdout=log_file,
            stderr=log_file,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            start_new_session=True,
        )
    try:
        info = daemon.start(data, 0, 1 << 20, wait=30)
        assert info["pid"] in (orphan.pid, read_pid(data))
        assert read_pid(data) == info["pid"]
        if info["pid"] == orphan.pid:  # the orphan won the lock, as it does when it started first
            assert info["already_running"] is True
    finally:
        agent_cli("stop", "--data-dir", str(data.root), check=False)
        orphan.wait(timeout=30)


def _alive(pid: int) -> bool:
    """Running (a zombie, left for an init that may never reap it, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_loopback_only(port: int) -> None:
    """Nothing answers on that port at the machine's other addresses."""
    addresses = _other_ipv4_addresses()
    for address in addresses:
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(1)
            s.connect((address, port))


def _other_ipv4_addresses() -> list[str]:
    from dstack_plan.agent.hostfacts import addresses

    return [
        a["address"]
        for a in addresses()
        if a["family"] == "ipv4" and not a["address"].startswith("127.")
    ]


async def test_start_reports_a_port_already_taken(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = agent_cli(
            "start", "--data-dir", str(tmp_path / "a"), "--port", str(port), check=False
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


async def test_metrics_and_host_facts(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(JobSpec(id="m1", run_name="r", commands=["true"]))
    await client.wait("m1", timeout=60)
    metrics = await client.metrics()
    assert 'dstack_agent_jobs{status="done"} 1' in metrics
    assert "# TYPE dstack_agent_cpu_seconds_total counter" in metrics
    assert "dstack_agent_memory_available_bytes " in metrics
    facts = await client.host_facts()
    assert facts.cpus >= 1 and facts.memory.total_bytes > 0 and facts.disk.free_bytes > 0
    assert any(a.address == "127.0.0.1" for a in facts.addresses)
    assert facts.gpus == []


async def test_the_agent_logs_json_lines_when_asked(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path / "agent")
    agent.args += ["--log-format", "json"]
    agent.start()
    try:
        client = agent.client()
        assert (await client.health()).version
        await client.aclose()
    finally:
        agent.kill(signal.SIGTERM)
    lines = [line for line in agent.log().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]
    messages = [e["message"] for e in entries if e["logger"].startswith("dstack_plan.agent")]
    assert any("serving" in m for m in messages) and any("stopped" in m for m in messages)


async def test_a_job_listing_the_client_has_is_not_sent_again(agent: AgentProcess) -> None:
    # A watch lists every agent's jobs each tick: an unchanged listing is answered 304 (its
    # ETag is a digest of the body), and the client reuses what it parsed from the last one.
    async with raw(agent) as http:
        first = await http.get("/jobs")
        tag = first.headers["ETag"]
        assert first.status_code == 200 and first.json() == {"jobs": []}
        again = await http.get("/jobs", headers={"If-None-Match": tag})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["ETag"] == tag
        other = await http.get("/jobs", headers={"If-None-Match": '"something-else"'})
        assert other.status_code == 200 and other.headers["ETag"] == tag

    client = agent.client()
    await client.submit(JobSpec(id="lj1", run_name="r", commands=["sleep 30"]))
    await wait_for_status(client, "lj1", ("running",), timeout=60)
    listed = await client.list_jobs()
    assert [j.id for j in listed] == ["lj1"]
    async with raw(agent) as http:  # the listing changed: the old ETag gets the new body
        changed = await http.get("/jobs", headers={"If-None-Match": tag})
        assert changed.status_code == 200 and changed.headers["ETag"] != tag
    unchanged = await client.list_jobs()
    assert unchanged[0] is listed[0]  # 304: not parsed again
    await client.stop("lj1", timeout=1)
    await client.wait("lj1", timeout=60)
    (after,) = await client.list_jobs()
    assert after.finished and not listed[0].finished  # a change is never served from memory
    assert (await client.list_jobs(status="running")) == []
    await client.aclose()
