"""A job's own SSH server (`agent/job_sshd.py`) on a real agent: the host's sshd on
127.0.0.1, its host key reported in the job's info, sessions entering the job; it survives an
agent restart with the container it serves and goes when the job ends."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobInfo, JobSpec, SSHAccess, SSHServerInfo
from dstack_plan.agent.client import AgentClient
from tests.conftest import require
from tests.infra.agent_helpers import wait_for_status
from tests.infra.agent_process import AgentProcess

pytestmark = pytest.mark.ssh


@pytest.fixture
def client_key(tmp_path: Path) -> Path:
    if not Path("/usr/sbin/sshd").exists():
        require("DSTACK_PLAN_REQUIRE_SSH", "a job's SSH server needs /usr/sbin/sshd")
    key = tmp_path / "client_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30
    )
    return key


async def wait_for_server(client: AgentClient, job_id: str, timeout: float = 20) -> SSHServerInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = await client.get_job(job_id)
        if info.ssh is not None:
            assert info.ssh.error is None, info.ssh.error
            return info.ssh
        assert time.monotonic() < deadline, f"no SSH server for {job_id}: {info}"
        await asyncio.sleep(0.05)


def ssh_argv(key: Path, server: SSHServerInfo, tmp_path: Path, command: str) -> list[str]:
    """ssh running `command` through the server, its host key pinned as the info says."""
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {server.host_key}\n")
    return [
        "ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
        "-p", str(server.port), f"{server.user}@127.0.0.1", command,
    ]  # fmt: skip


def ssh(key: Path, server: SSHServerInfo, tmp_path: Path, command: str) -> str:
    done = subprocess.run(
        ssh_argv(key, server, tmp_path, command),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
    except OSError:
        return True
    return False


def dev_spec(key: Path, **fields: object) -> JobSpec:
    public = key.with_suffix(".pub").read_text().strip()
    return JobSpec(
        id="dev",
        run_name="dev",
        commands=["exec sleep 300"],
        env={"WHO": "the job"},
        stop_timeout=1,
        ssh=SSHAccess(public_key=public),
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.docker
async def test_a_container_jobs_server_outlives_an_agent_restart_and_ends_with_the_job(
    agent: AgentProcess, busybox_image: str, client_key: Path, tmp_path: Path
) -> None:
    client = agent.client()
    await client.submit(dev_spec(client_key, image=busybox_image))
    server = await wait_for_server(client, "dev")
    assert server.host_key is not None and server.host_key.startswith("ssh-ed25519 ")
    assert server.working_dir == "/"
    assert ssh(client_key, server, tmp_path, "echo $WHO; readlink /bin/sh") == "the job\nbusybox\n"
    record = (agent.data_dir / "jobs" / "dev" / "job.json").read_text()
    assert "BEGIN OPENSSH PRIVATE KEY" not in record  # the host key's private half stays put

    agent.restart()  # SIGKILL: the container is re-adopted, and its server kept
    client = agent.client()
    again = await wait_for_server(client, "dev")
    assert (again.port, again.host_key) == (server.port, server.host_key)
    assert ssh(client_key, again, tmp_path, "echo $WHO") == "the job\n"

    await client.stop("dev")
    stopped: JobInfo = await wait_for_status(client, "dev", ("terminated",), timeout=30)
    assert stopped.ssh is None
    assert server.port is not None and refused(server.port)


async def test_a_process_jobs_session_runs_in_its_working_dir_and_a_plain_job_has_none(
    agent: AgentProcess, client_key: Path, tmp_path: Path
) -> None:
    client = agent.client()
    await client.submit(dev_spec(client_key, working_dir="here"))
    server = await wait_for_server(client, "dev")
    workdir = str(agent.data_dir / "jobs" / "dev" / "work" / "here")
    assert server.working_dir == workdir
    assert ssh(client_key, server, tmp_path, "pwd; echo $WHO") == f"{workdir}\nthe job\n"

    # an open session is activity (watch's inactivity_duration), noted when the job is asked
    before = (await client.get_job("dev")).last_activity_at
    assert before is not None
    session = subprocess.Popen(
        ssh_argv(client_key, server, tmp_path, "sleep 5"), stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while (await client.get_job("dev")).last_activity_at == before:
            assert time.monotonic() < deadline, "an open session was not noted as activity"
            await asyncio.sleep(0.1)
    finally:
        session.kill()
        session.wait()

    plain = await client.submit(JobSpec(id="plain", run_name="plain", commands=["sleep 60"]))
    assert plain.ssh is None and "ssh" not in plain.spec

    await client.stop("dev", abort=True)
    await wait_for_status(client, "dev", ("aborted",), timeout=30)
    assert server.port is not None and refused(server.port)
