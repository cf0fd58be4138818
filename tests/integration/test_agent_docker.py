"""The docker runtime end to end: a real agent process driving the local Docker engine."""

from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from dstack_plan.agent.api_models import JobSpec
from tests.infra.agent_helpers import wait_for_log, wait_for_status
from tests.infra.agent_process import AgentProcess
from tests.integration.test_agent_process import assert_nowhere, job_record

pytestmark = pytest.mark.docker
NET = 60.0
"""Seconds a test waits for a container job before concluding it will not get there (a
safety net: passing never waits it out)."""
NET_POLLS = 6000
"""Polls (10 ms apart, at least) before a polling loop gives up: the same safety net."""


def spec(job_id: str, image: str, *commands: str, **kwargs: Any) -> JobSpec:
    return JobSpec(
        id=job_id, run_name="docker-run", image=image, commands=list(commands), **kwargs
    )


def containers(docker_client: Any, agent: AgentProcess, job_id: str) -> list[Any]:
    return docker_client.containers.list(
        all=True,
        filters={
            "label": [f"dstack-plan.agent-id={agent.agent_id}", f"dstack-plan.job-id={job_id}"]
        },
    )


async def test_container_job_runs_with_labels_logs_and_cleanup(
    agent: AgentProcess, busybox_image: str, docker_client: Any
) -> None:
    client = agent.client()
    await client.submit(
        spec(
            "c1",
            busybox_image,
            "echo out-$MODE",
            "echo err >&2",
            "pwd",
            "while [ ! -e /tmp/go ]; do sleep 0.02; done",  # until the test has looked
            env={"MODE": "docker"},
            working_dir="/tmp",
            labels={"team": "ml"},
            run_id="run-uuid-1",
        )
    )
    info = await wait_for_status(client, "c1", ("running",), timeout=NET)
    assert info.runtime == "docker" and info.container_id
    [container] = containers(docker_client, agent, "c1")
    assert container.labels["dstack-plan.run-name"] == "docker-run"
    assert container.labels["dstack-plan.run-id"] == "run-uuid-1"
    assert container.labels["team"] == "ml"
    assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    container.exec_run(["touch", "/tmp/go"])
    done = await client.wait("c1", timeout=NET)
    assert (done.status.value, done.termination_reason.value, done.exit_code) == (
        "done",
        "done_by_runner",
        0,
    )
    # Docker copies stdout and stderr separately: their relative order is not kept.
    logs = await client.read_all_logs("c1")
    assert sorted(logs.splitlines()) == [b"/tmp", b"err", b"out-docker"]
    assert containers(docker_client, agent, "c1") == []  # removed once its output was captured


async def test_container_exit_code_and_limits(agent: AgentProcess, busybox_image: str) -> None:
    client = agent.client()
    await client.submit(
        spec(
            "c2",
            busybox_image,
            "df -m /dev/shm | tail -1",
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
            "exit 42",
            shm_size=64 * 1024 * 1024,
            memory=128 * 1024 * 1024,
            cpus=0.5,
        )
    )
    info = await client.wait("c2", timeout=NET)
    assert (info.status.value, info.termination_reason.value, info.exit_code) == (
        "failed",
        "container_exited_with_error",
        42,
    )
    logs = (await client.read_all_logs("c2")).decode()
    assert " 64 " in logs.splitlines()[0]  # /dev/shm is 64 MiB
    assert str(128 * 1024 * 1024) in logs


async def test_stop_kills_a_container_ignoring_sigterm(
    agent: AgentProcess, busybox_image: str
) -> None:
    client = agent.client()
    await client.submit(spec("c3", busybox_image, "trap '' TERM", "echo ready", "sleep 3600"))
    await wait_for_log(client, "c3", b"ready", timeout=NET)
    await client.stop("c3", timeout=1)
    info = await client.wait("c3", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == (
        "terminated",
        "terminated_by_user",
    )
    assert info.exit_code == 137  # SIGKILL: the SIGTERM it ignored did not end it
    # the stop was carried out with the timeout given, and (by the agent's own record) the
    # kill came no sooner than that after the stop was asked
    stop = job_record(agent, "c3")["stop"]
    assert (stop["reason"], stop["timeout"]) == ("terminated_by_user", 1)
    assert info.finished_at is not None and info.finished_at >= stop["requested_at"] + 1


async def test_max_duration_stops_the_container(agent: AgentProcess, busybox_image: str) -> None:
    client = agent.client()
    await client.submit(spec("c4", busybox_image, "sleep 3600", max_duration=0.5, stop_timeout=0))
    info = await client.wait("c4", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == (
        "terminated",
        "max_duration_exceeded",
    )


async def test_unpullable_image_fails_clearly(agent: AgentProcess) -> None:
    client = agent.client()
    # A registry on a closed loopback port: the pull fails at once, without DNS.
    await client.submit(spec("c5", "127.0.0.1:9/nope/missing:1.0", "true"))
    info = await client.wait("c5", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == (
        "failed",
        "creating_container_error",
    )
    assert "cannot pull image 127.0.0.1:9/nope/missing:1.0" in info.termination_message
    assert "connection refused" in info.termination_message.lower()


async def test_gpu_request_without_nvidia_runtime_fails_and_cleans_up(
    agent_factory: Any, fake_gpu_bin: Path, busybox_image: str, docker_client: Any
) -> None:
    agent = agent_factory(extra_path=fake_gpu_bin)
    client = agent.client()
    await client.submit(spec("c6", busybox_image, "true", gpus=[1]))
    info = await client.wait("c6", timeout=NET)
    assert (info.status.value, info.termination_reason.value) == (
        "failed",
        "creating_container_error",
    )
    assert "could not select device driver" in info.termination_message
    assert containers(docker_client, agent, "c6") == []
    assert (await client.host_facts()).gpus_allocated == {}


async def test_secret_env_in_a_container(agent: AgentProcess, busybox_image: str) -> None:
    secret = "tok-" + secrets.token_hex(20)
    client = agent.client()
    await client.submit(
        spec(
            "c7",
            busybox_image,
            'printf %s "$HF_TOKEN" | md5sum',
            env={"HF_TOKEN": SecretStr(secret)},
        )
    )
    info = await client.wait("c7", timeout=NET)
    assert info.status.value == "done"
    assert hashlib.md5(secret.encode()).hexdigest().encode() in await client.read_all_logs("c7")
    assert_nowhere(secret, agent)


async def test_container_outlives_a_killed_agent_and_is_readopted(
    agent: AgentProcess, busybox_image: str, docker_client: Any
) -> None:
    client = agent.client()
    await client.submit(
        spec(
            "c8",
            busybox_image,
            "for i in $(seq 1 3); do echo tick-$i; echo tock-$i >&2; done",
            # the rest only once the agent is gone, then it runs on until the test says
            "while [ ! -e /tmp/agent-gone ]; do sleep 0.02; done",
            "for i in $(seq 4 30); do echo tick-$i; echo tock-$i >&2; sleep 0.01; done",
            "while [ ! -e /tmp/agent-back ]; do sleep 0.02; done",
        )
    )
    await wait_for_log(client, "c8", b"tick-3\n", timeout=NET)
    agent.kill()  # SIGKILL, mid-job
    [container] = containers(docker_client, agent, "c8")
    assert container.status == "running"
    container.exec_run(["touch", "/tmp/agent-gone"])
    # output keeps coming while no agent listens: all of it, as the engine has it
    for _ in range(NET_POLLS):
        if b"tick-30\n" in container.logs(stdout=True, stderr=False):
            break
        time.sleep(0.01)
    assert b"tick-30\n" in container.logs(stdout=True, stderr=False)

    agent.start()
    client = agent.client()
    info = await client.get_job("c8")
    assert info.status.value == "running"  # re-adopted: it waits for the test
    container.exec_run(["touch", "/tmp/agent-back"])
    received = b""
    async for chunk in client.follow_logs("c8"):
        received += chunk.data
    # Each stream complete and in order, nothing twice (docker keeps no order across streams).
    lines = received.splitlines()
    assert [x for x in lines if x.startswith(b"tick")] == [b"tick-%d" % i for i in range(1, 31)]
    assert [x for x in lines if x.startswith(b"tock")] == [b"tock-%d" % i for i in range(1, 31)]
    assert len(lines) == 60
    info = await client.wait("c8", timeout=NET)
    assert (info.status.value, info.exit_code) == ("done", 0)
    assert containers(docker_client, agent, "c8") == []


async def test_readopted_container_can_be_stopped(agent: AgentProcess, busybox_image: str) -> None:
    client = agent.client()
    await client.submit(spec("c9", busybox_image, "echo up", "sleep 60"))
    await wait_for_log(client, "c9", b"up", timeout=NET)
    agent.restart()
    client = agent.client()
    assert (await client.get_job("c9")).status.value == "running"
    await client.stop("c9", timeout=0)
    info = await client.wait("c9", timeout=NET)
    assert info.termination_reason.value == "terminated_by_user"
    assert await client.read_all_logs("c9") == b"up\n"


async def test_bridge_network_publishes_ports(agent: AgentProcess, busybox_image: str) -> None:
    client = agent.client()
    await client.submit(
        spec(
            "c10",
            busybox_image,
            "sleep 60",
            network_mode="bridge",
            ports=[{"container_port": 8080}],
        )
    )
    info = await wait_for_status(client, "c10", ("running",), timeout=NET)
    [port] = info.ports
    assert port.container_port == 8080 and port.host_port and port.host_port > 0
    await client.stop("c10", abort=True)
    assert (await client.wait("c10", timeout=NET)).status.value == "aborted"
