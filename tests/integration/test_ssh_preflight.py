"""Pre-flight over real SSH connections to namespace hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dstack_plan.errors import SSHError
from dstack_plan.providers.ssh.connect import SSHPool
from dstack_plan.providers.ssh.hostkeys import HostKeyPolicy, MemoryHostKeyStore
from dstack_plan.providers.ssh.models import SSHTarget
from dstack_plan.providers.ssh.preflight import PreflightReport, preflight
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


async def check(hosts: SSHTestHosts, tmp_path: Path, name: str, **options: Any) -> PreflightReport:
    target = SSHTarget(hosts[name].address, "root", identity_file=str(hosts.client_key))
    keys = HostKeyPolicy(MemoryHostKeyStore(), known_hosts=tmp_path / "known_hosts")
    async with SSHPool(keys) as pool:
        conn = await pool.connect(target)
        return await preflight(conn, name, **options)


async def test_a_ready_host_passes_with_its_facts(
    ssh_hosts: SSHTestHosts, tmp_path: Path, docker_client: Any
) -> None:
    report = await check(ssh_hosts, tmp_path, "h1", need_containers=True)
    assert report.failures == ()
    assert report.ok
    assert report.user == "root"
    assert report.python is not None and report.python.startswith("3.")
    assert report.docker == "user"
    assert report.tcp_forwarding
    assert report.nvidia_gpus == 0
    assert report.free_disk_mb is not None and report.free_disk_mb > 200


async def test_a_bare_host_gets_one_actionable_message_per_problem(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    report = await check(ssh_hosts, tmp_path, "bare", need_containers=True)
    assert report.python is None and report.docker == "missing" and not report.tcp_forwarding
    assert report.failures == (
        "python3 is not on the PATH of user root: the agent needs python3 >= 3.9 "
        "(Debian/Ubuntu: apt-get install python3)",
        "Docker is not installed and this fleet's runs need containers: install Docker "
        "Engine (https://docs.docker.com/engine/install/), or use runs without `image:`",
        "sshd does not allow TCP forwarding, through which the agent is reached: set "
        "`AllowTcpForwarding yes` in /etc/ssh/sshd_config and reload sshd",
    )
    with pytest.raises(SSHError, match=r"^bare: pre-flight failed: python3 is not on the PATH"):
        report.raise_for_failures()


async def test_docker_is_checked_only_when_runs_need_containers(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    report = await check(ssh_hosts, tmp_path, "bare", need_containers=False)
    assert report.docker is None
    assert not any("Docker" in f for f in report.failures)


async def test_nvidia_gpus_without_the_container_runtime(
    ssh_hosts: SSHTestHosts, tmp_path: Path, docker_client: Any
) -> None:
    if "nvidia" in str(docker_client.info().get("Runtimes", {})):
        pytest.skip("this Docker engine has an NVIDIA runtime")
    report = await check(ssh_hosts, tmp_path, "gpu", need_containers=True)
    assert report.nvidia_gpus == 1 and not report.nvidia_runtime
    assert report.failures == (
        "the host has 1 NVIDIA GPU(s) but Docker has no NVIDIA runtime: install the NVIDIA "
        "Container Toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker`, then "
        "restart Docker",
    )
    # without containers, jobs run as processes: the GPUs are usable as they are
    assert (await check(ssh_hosts, tmp_path, "gpu", need_containers=False)).ok
    # CPU-only containers need Docker, not its NVIDIA runtime
    cpu_only = await check(
        ssh_hosts, tmp_path, "gpu", need_containers=True, need_gpu_containers=False
    )
    assert cpu_only.ok and cpu_only.docker in ("user", "sudo")


async def test_free_disk_threshold_and_a_hostile_agent_dir(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    hostile = f"agent dir; touch {marker}; $(touch {marker})"
    report = await check(
        ssh_hosts, tmp_path, "h2", need_containers=False, agent_dir=hostile, min_free_mb=10**9
    )
    assert not marker.exists()  # the path reached the host quoted, as one word
    assert report.free_disk_mb is not None
    assert report.failures == (
        f"only {report.free_disk_mb} MB free for ~/{hostile}; the agent needs at least "
        f"{10**9} MB: free some disk space",
    )
