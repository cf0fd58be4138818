"""Where jobs listen: bridged containers get their own loopback host ports from Docker, the agent
reports them (and keeps them across its restart); a process reports the port it binds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobSpec
from tests.infra.agent_helpers import wait_for_status
from tests.infra.agent_process import AgentProcess
from tests.infra.http_probe import fetch

SERVE = [
    "mkdir -p /www",
    "echo replica-$DSTACK_REPLICA_NUM > /www/index.html",
    "exec httpd -f -p 8799 -h /www",
]


def replica(job_id: str, image: str, number: int) -> JobSpec:
    return JobSpec(
        id=job_id,
        run_name="web",
        image=image,
        commands=SERVE,
        env={"DSTACK_REPLICA_NUM": str(number)},
        network_mode="bridge",
        ports=[{"container_port": 8799}],
        stop_timeout=1,
    )


@pytest.mark.docker
async def test_two_bridged_replicas_of_one_port_each_get_a_loopback_host_port(
    agent: AgentProcess, busybox_image: str, docker_client: Any
) -> None:
    client = agent.client()
    for number in (0, 1):
        await client.submit(replica(f"web-{number}", busybox_image, number))
    infos = [await wait_for_status(client, f"web-{n}", ("running",), 15) for n in (0, 1)]
    ports = [info.ports[0] for info in infos]
    assert [(p.container_port, p.host_ip) for p in ports] == [(8799, "127.0.0.1")] * 2
    assert ports[0].host_port != ports[1].host_port
    assert str(ports[0]) == f"127.0.0.1:{ports[0].host_port} -> 8799"
    answers = await asyncio.gather(
        *(asyncio.to_thread(fetch, p.host_port) for p in ports if p.host_port)
    )
    assert answers == ["replica-0", "replica-1"]
    # published on loopback only, as the agent itself listens
    container = docker_client.containers.get(infos[0].container_id)
    bindings = container.attrs["HostConfig"]["PortBindings"]["8799/tcp"]
    assert [b["HostIp"] for b in bindings] == ["127.0.0.1"]

    agent.restart()  # a re-adopted container still says where it listens
    client = agent.client()
    again = await client.get_job("web-1")
    assert again.status.value == "running" and again.ports == infos[1].ports
    for number in (0, 1):
        await client.stop(f"web-{number}", abort=True)


async def test_a_process_reports_the_port_it_binds_on_the_host(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(
        JobSpec(id="p1", run_name="web", commands=["sleep 30"], ports=[{"container_port": 18801}])
    )
    info = await wait_for_status(client, "p1", ("running",))
    [port] = info.ports
    assert (port.container_port, port.host_port, port.host_ip) == (18801, 18801, None)
    assert str(port) == "18801"
    await client.stop("p1", abort=True)
