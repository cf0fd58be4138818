"""The one-file agent bundle runs with nothing but python3 (isolated, no site-packages)."""

from __future__ import annotations

import glob
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.build import build_zipapp
from tests.infra.agent_process import AgentProcess

CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zipapp(tmp_path_factory.mktemp("bundle") / "agent.pyz")


def system_python() -> str:
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("no python3 on this machine")


def test_bundle_holds_the_daemon_and_sdk_but_not_the_client(bundle: Path) -> None:
    names = set(zipfile.ZipFile(bundle).namelist())
    assert "__main__.py" in names and "dstack_plan/agent/server.py" in names
    assert "docker/__init__.py" in names and "urllib3/__init__.py" in names
    assert "dstack_plan/agent/client.py" not in names
    assert "dstack_plan/agent/api_models.py" not in names
    assert not any(n.endswith(".so") for n in names)
    assert not any(n.startswith(("pydantic", "httpx", "dstack_plan/config")) for n in names)


async def test_bundle_serves_and_runs_jobs_in_isolation(
    agent_factory: Any, bundle: Path, tmp_path: Path
) -> None:
    agent: AgentProcess = agent_factory(
        "pyz", command=[system_python(), "-I", str(bundle)], env=CLEAN_ENV
    )
    client = agent.client()
    health = await client.health()
    assert health.status == "ok"
    await client.submit(JobSpec(id="p1", run_name="r", commands=["echo from-pyz"]))
    assert (await client.wait("p1", timeout=10)).status.value == "done"
    assert await client.read_all_logs("p1") == b"from-pyz\n"
    facts = await client.host_facts()
    if not facts.docker.present:
        pytest.skip(f"no docker engine for the bundled SDK: {facts.docker.error}")
    assert facts.docker.error is None


@pytest.mark.docker
async def test_bundled_docker_sdk_runs_containers(
    agent_factory: Any, bundle: Path, busybox_image: str
) -> None:
    agent: AgentProcess = agent_factory(
        "pyz-docker", command=[system_python(), "-I", str(bundle)], env=CLEAN_ENV
    )
    client = agent.client()
    await client.submit(JobSpec(id="d1", run_name="r", image=busybox_image, commands=["echo hi"]))
    info = await client.wait("d1", timeout=20)
    assert info.status.value == "done", info.termination_message
    assert await client.read_all_logs("d1") == b"hi\n"


def oldest_python() -> str | None:
    """A python 3.9 if this machine has one (pyenv or system), to check the floor."""
    candidates = [
        *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.9*/bin/python3"))),
        "/usr/bin/python3.9",
    ]
    for candidate in candidates:
        try:
            ok = subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=10)
        except OSError:
            continue
        if ok.returncode == 0:
            return candidate
    return None


async def test_bundle_runs_on_python_3_9(agent_factory: Any, bundle: Path) -> None:
    python = oldest_python()
    if python is None:
        pytest.skip("no python 3.9 on this machine")
    agent: AgentProcess = agent_factory("py39", command=[python, "-I", str(bundle)], env=CLEAN_ENV)
    client = agent.client()
    await client.submit(JobSpec(id="old", run_name="r", commands=["echo on-3.9"]))
    assert (await client.wait("old", timeout=10)).status.value == "done"
    facts = await client.host_facts()
    assert facts.python.startswith("3.9")
    # The SDK vendored from this (newer) environment may not import on 3.9: then the agent
    # says so and keeps the process runtime; bundles built with --wheels for 3.9 have docker.
    if not facts.docker.present:
        assert facts.docker.error
