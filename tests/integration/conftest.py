"""Fixtures for integration tests: a Docker engine, local images, real agent processes.

`async def` tests here run in a fresh event loop each (no pytest-asyncio needed); agent clients
made with `AgentProcess.client()` are closed in that loop when the test ends.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.client import AgentClient
from tests.infra.agent_process import AgentProcess, kill_job_groups, remove_agent_containers
from tests.infra.docker_images import ensure_busybox_image

_OPEN_CLIENTS: list[AgentClient] = []

FAKE_NVIDIA_SMI = """#!/bin/sh
# Two fake GPUs, answering the two queries the agent makes.
case "$*" in
  *memory.total,uuid*)
    echo "0, NVIDIA Fake A100, 81920, GPU-fake-0"
    echo "1, NVIDIA Fake A100, 81920, GPU-fake-1" ;;
  *utilization.gpu*)
    echo "0, 37, 1024, 81920"
    echo "1, 0, 0, 81920" ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def run() -> None:
        try:
            await pyfuncitem.obj(**kwargs)
        finally:
            while _OPEN_CLIENTS:
                await _OPEN_CLIENTS.pop().aclose()

    asyncio.run(run())
    return True


@pytest.fixture(scope="session")
def busybox_image(docker_client: Any) -> str:
    """`dstack-plan-test/busybox:latest`, imported from /bin/busybox."""
    return ensure_busybox_image(docker_client)


@pytest.fixture(scope="session")
def agent_bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The agent bundle (`AgentBundle`) of today's sources, built once for the session (2 s
    of CPU): the modules that install it on the hosts or run it share it, read only. A build
    is reproducible (the same sources, the same bytes): a module's own would be this one."""
    from dstack_plan.providers.ssh.bundle import build_bundle

    return build_bundle(tmp_path_factory.mktemp("agent-bundle") / "agent.pyz")


@pytest.fixture
def fake_gpu_bin(tmp_path: Path) -> Path:
    """A directory with a fake `nvidia-smi` reporting two GPUs, to put first on PATH."""
    directory = tmp_path / "fake-bin"
    directory.mkdir()
    script = directory / "nvidia-smi"
    script.write_text(FAKE_NVIDIA_SMI)
    script.chmod(0o755)
    return directory


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator[Any]:
    """`make(**AgentProcess kwargs)` starts agents; all are killed and cleaned up at the end."""
    started: list[AgentProcess] = []

    def make(name: str = "agent", **kwargs: Any) -> AgentProcess:
        process = AgentProcess(tmp_path / name, **kwargs)
        process.on_client = _OPEN_CLIENTS.append
        process.start()
        started.append(process)
        return process

    yield make
    ids = []
    for process in started:
        process.kill()
        try:
            ids.append(process.agent_id)
        except OSError:
            pass
        kill_job_groups(process.data_dir)
    remove_agent_containers(ids)


@pytest.fixture
def agent(agent_factory: Any) -> AgentProcess:
    """One agent on a fresh data dir."""
    return agent_factory()


@pytest.fixture
def client(agent: AgentProcess) -> AgentClient:
    """A connected client for `agent`."""
    return agent.client()
