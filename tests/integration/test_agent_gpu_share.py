"""Shared GPUs against a real agent with a fake nvidia-smi: several jobs on one device, the
409 that says what is free, MPS limits when a control socket exists, shares kept over a
restart."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.dockerlib import DockerEngine
from dstack_plan.agent.job import Job
from dstack_plan.agent.logstore import LogStore
from dstack_plan.agent.runtimes.docker_runtime import DockerRuntime
from dstack_plan.agent.spec import parse_job_spec
from dstack_plan.errors import AgentError
from tests.infra.agent_helpers import wait_for_log, wait_for_status
from tests.infra.agent_process import REPO_ROOT, AgentProcess

ONE_GPU_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *memory.total,uuid*) echo "0, NVIDIA Fake L4, 24576, GPU-fake-0" ;;
  *utilization.gpu*) echo "0, 5, 100, 24576" ;;
  *) exit 2 ;;
esac
"""
SHOW_ENV = (
    'echo "dev=$CUDA_VISIBLE_DEVICES share=$DSTACK_GPU_SHARE'
    " threads=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-none}"
    ' mem=${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-none} pipe=${CUDA_MPS_PIPE_DIRECTORY:-none} end"'
)


@pytest.fixture
def one_gpu_bin(tmp_path: Path) -> Path:
    directory = tmp_path / "one-gpu-bin"
    directory.mkdir()
    script = directory / "nvidia-smi"
    script.write_text(ONE_GPU_NVIDIA_SMI)
    script.chmod(0o755)
    return directory


@pytest.fixture
def mps_dir(tmp_path: Path) -> Iterator[Path]:
    """A pipe directory with a `control` unix socket, as a running MPS daemon leaves it.
    (A short path: unix socket paths are limited to ~108 bytes.)"""
    directory = Path(os.path.realpath("/tmp")) / f"mps-{os.getpid()}-{tmp_path.name[-20:]}"
    directory.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(directory / "control"))
    yield directory
    sock.close()
    (directory / "control").unlink()
    directory.rmdir()


def start(agent_factory: Any, bin_dir: Path, pipe_dir: Path) -> AgentProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
    return agent_factory(extra_path=bin_dir, env=env)


def spec(job_id: str, *commands: str, **kwargs: Any) -> JobSpec:
    return JobSpec(id=job_id, run_name="share-run", commands=list(commands), **kwargs)


async def test_shares_run_together_and_a_full_gpu_refuses_more(
    agent_factory: Any, one_gpu_bin: Path, tmp_path: Path
) -> None:
    agent = start(agent_factory, one_gpu_bin, tmp_path / "no-mps")
    client = agent.client()
    for name in ("a", "b"):
        await client.submit(spec(name, SHOW_ENV, "sleep 60", gpus=1, gpu_share=500))
    for name in ("a", "b"):
        line = (await wait_for_log(client, name, b" end")).decode().strip()
        # the pipe variable is the agent's own, inherited: nothing listens there
        assert line == f"dev=0 share=50 threads=none mem=none pipe={tmp_path / 'no-mps'} end"
        info = await wait_for_status(client, name, ("running",))
        assert (info.gpus, info.gpu_share, info.gpu_sharing) == ([0], 500, "time-slicing")

    with pytest.raises(AgentError) as refused:
        await client.submit(spec("c", "true", gpus=1, gpu_share=600))
    assert refused.value.status == 409
    assert "GPU 0: 0% free (job a 50%, job b 50%)" in str(refused.value)
    with pytest.raises(AgentError) as refused:
        await client.submit(spec("w", "true", gpus=1))
    assert refused.value.status == 409 and "only 0 are free" in str(refused.value)

    facts = await client.host_facts()
    assert facts.gpu_shares == {0: {"a": 500, "b": 500}}
    assert facts.gpus_allocated == {0: "a,b"}

    await client.stop("a", timeout=1)
    await client.wait("a", timeout=10)
    await client.submit(spec("c", "true", gpus=[0], gpu_share=400))
    assert (await client.wait("c", timeout=10)).status.value == "done"
    assert (await client.host_facts()).gpu_shares == {0: {"b": 500}}


async def test_invalid_shares_are_refused_naming_the_field(
    agent_factory: Any, one_gpu_bin: Path, tmp_path: Path
) -> None:
    agent = start(agent_factory, one_gpu_bin, tmp_path / "no-mps")
    client = agent.client()
    body = {"run_name": "r", "commands": ["true"], "gpus": 2, "gpu_share": 500}
    with pytest.raises(AgentError) as refused:
        await client._request("POST", "/jobs", body=body)  # past the controller's own check
    assert refused.value.status == 400
    assert "gpu_share: is a share of one GPU: needs gpus 1 or one index" in str(refused.value)


async def test_mps_limits_when_a_control_daemon_listens(
    agent_factory: Any, one_gpu_bin: Path, mps_dir: Path
) -> None:
    agent = start(agent_factory, one_gpu_bin, mps_dir)
    client = agent.client()
    await client.submit(spec("m", SHOW_ENV, gpus=1, gpu_share=250))
    line = (await wait_for_log(client, "m", b" end")).decode().strip()
    # 25% of the fake GPU's 24576 MiB; device 0 is the job's one visible GPU
    assert line == f"dev=0 share=25 threads=25 mem=0=6144M pipe={mps_dir} end"
    info = await client.wait("m", timeout=10)
    assert (info.gpu_share, info.gpu_sharing) == (250, "mps")
    whole = await client.submit(spec("w", "true", gpus=1))
    assert (whole.gpu_share, whole.gpu_sharing) == (None, None)


@pytest.mark.docker
async def test_shares_are_held_again_after_a_restart(
    agent_factory: Any, one_gpu_bin: Path, tmp_path: Path, busybox_image: str
) -> None:
    # A container job survives the agent; its GPU share must too. Docker here has no NVIDIA
    # runtime, so the job runs without a device and its record is given the share it would
    # have had, as a host with GPUs writes it.
    agent = start(agent_factory, one_gpu_bin, tmp_path / "no-mps")
    client = agent.client()
    await client.submit(
        JobSpec(id="kept", run_name="share-run", image=busybox_image, commands=["sleep 600"])
    )
    await wait_for_status(client, "kept", ("running",), timeout=30)
    agent.kill()
    record_path = agent.data_dir / "jobs" / "kept" / "job.json"
    record = json.loads(record_path.read_text())
    record["spec"].update(gpus=1, gpu_share=700)
    record.update(gpus=[0], gpu_sharing="time-slicing", gpu_share_env={"DSTACK_GPU_SHARE": "70"})
    record_path.write_text(json.dumps(record))
    agent.start()
    client = agent.client()
    info = await wait_for_status(client, "kept", ("running",), timeout=30)
    assert (info.gpus, info.gpu_share, info.gpu_sharing) == ([0], 700, "time-slicing")
    assert (await client.host_facts()).gpu_shares == {0: {"kept": 700}}
    with pytest.raises(AgentError) as refused:
        await client.submit(spec("more", "true", gpus=1, gpu_share=400))
    assert refused.value.status == 409 and "30% free (job kept 70%)" in str(refused.value)
    await client.stop("kept", timeout=1)
    await client.wait("kept", timeout=20)
    assert (await client.host_facts()).gpu_shares == {}


@pytest.mark.docker
def test_a_docker_job_under_mps_gets_the_pipe_dir_and_host_ipc(
    docker_client: Any, tmp_path: Path
) -> None:
    spec_ = parse_job_spec(
        {"id": "d", "run_name": "r", "image": "busybox", "gpus": 1, "gpu_share": 500}
    )
    logs = LogStore(tmp_path / "logs", 1024)
    job = Job(spec=spec_, runtime="docker", logs=logs, gpus=[0], gpu_vendor="nvidia")
    job.gpu_sharing = "mps"
    job.gpu_share_env = {"DSTACK_GPU_SHARE": "50", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps-x"}
    runtime = DockerRuntime(DockerEngine(), "agent", 1024)
    config = runtime._container_config(docker_client.api, job)
    assert "DSTACK_GPU_SHARE=50" in config["environment"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-x" in config["environment"]
    host = config["host_config"]
    assert host["IpcMode"] == "host"
    assert {"Target": "/tmp/mps-x", "Source": "/tmp/mps-x"}.items() <= host["Mounts"][0].items()
    job.gpu_sharing = "time-slicing"
    plain = runtime._container_config(docker_client.api, job)["host_config"]
    assert "IpcMode" not in plain and "Mounts" not in plain
    logs.close()
