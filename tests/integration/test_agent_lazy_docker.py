"""The agent starts without the docker SDK: it imports it for the first request needing it.

The agents here run from the bundle (as on a host), with `python3 -X importtime`, which writes
a line per module imported to stderr (the agent's log): the SDK's modules appear there only
once a docker job came. Host facts still say whether an engine answers, asking its socket.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.dockerlib import DEFAULT_HOST, probe
from dstack_plan.errors import AgentError
from dstack_plan.providers.ssh.bundle import build_bundle
from tests.infra.agent_process import AgentProcess
from tests.integration.test_agent_zipapp import CLEAN_ENV, system_python


@pytest.fixture(scope="module")
def bundle(agent_bundle: Any) -> Path:
    return agent_bundle.path  # the session's (tests/integration/conftest.py)


def imported(agent: AgentProcess, module: str) -> bool:
    """The agent's log shows `module` imported (a `-X importtime` line)."""
    return re.search(rf"\|\s+{re.escape(module)}$", agent.log(), re.MULTILINE) is not None


def start(agent_factory: Any, bundle: Path, name: str, **env: str) -> AgentProcess:
    agent: AgentProcess = agent_factory(
        name,
        command=[system_python(), "-X", "importtime", "-I", str(bundle)],
        env={**CLEAN_ENV, **env},
    )
    return agent


@pytest.mark.docker
async def test_health_and_host_facts_answer_before_docker_is_imported_then_jobs_run(
    agent_factory: Any, bundle: Path, busybox_image: str, docker_client: Any
) -> None:
    agent = start(agent_factory, bundle, "lazy")
    client = agent.client()
    assert (await client.health()).status == "ok"
    facts = await client.host_facts()
    # the engine's own version, as the SDK reads it, without the SDK
    assert facts.docker.present and facts.docker.error is None
    assert facts.docker.version == docker_client.version()["Version"]
    assert facts.docker.api_version == docker_client.version()["ApiVersion"]
    assert not imported(agent, "docker") and not imported(agent, "requests")

    await client.submit(JobSpec(id="d1", run_name="r", image=busybox_image, commands=["echo hi"]))
    info = await client.wait("d1", timeout=30)
    assert info.status.value == "done", info.termination_message
    assert await client.read_all_logs("d1") == b"hi\n"
    assert imported(agent, "docker")  # the job needed it
    after = await client.host_facts()
    assert after.docker.present and after.docker.version == facts.docker.version


async def test_a_host_without_an_engine_says_so_and_refuses_images(
    agent_factory: Any, bundle: Path, tmp_path: Path
) -> None:
    socket = tmp_path / "no-engine.sock"
    agent = start(agent_factory, bundle, "no-engine", DOCKER_HOST=f"unix://{socket}")
    client = agent.client()
    facts = await client.host_facts()
    assert not facts.docker.present
    assert facts.docker.error is not None and "no docker engine answers" in facts.docker.error
    with pytest.raises(AgentError, match="this host cannot run images"):
        await client.submit(JobSpec(id="d1", run_name="r", image="busybox", commands=["true"]))
    # process jobs run all the same
    await client.submit(JobSpec(id="p1", run_name="r", commands=["echo fine"]))
    assert (await client.wait("p1", timeout=15)).status.value == "done"


@pytest.mark.docker
def test_probe_reads_the_engine_the_sdk_would_use(docker_client: Any) -> None:
    version = probe({})  # no DOCKER_HOST: the SDK's default socket
    assert version is not None and version["Version"] == docker_client.version()["Version"]
    socket_path = DEFAULT_HOST.removeprefix("unix://")
    assert probe({"DOCKER_HOST": f"unix://{socket_path}"}) == version


def test_probe_leaves_engines_it_cannot_reach_to_the_sdk(tmp_path: Path) -> None:
    assert probe({"DOCKER_HOST": "ssh://user@host"}) is None
    assert probe({"DOCKER_HOST": "tcp://127.0.0.1:2376", "DOCKER_TLS_VERIFY": "1"}) is None
    with pytest.raises(OSError):
        probe({"DOCKER_HOST": f"unix://{tmp_path}/missing.sock"})


async def test_a_bundle_without_the_sdk_says_so_even_with_an_engine(
    agent_factory: Any, tmp_path: Path
) -> None:
    bare = build_bundle(tmp_path / "bare.pyz", include_docker=False).path
    agent = start(agent_factory, bare, "no-sdk")
    facts = await agent.client().host_facts()
    assert not facts.docker.present
    assert facts.docker.error is not None and "docker SDK not usable" in facts.docker.error
