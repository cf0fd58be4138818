"""What the pre-flight of an SSH fleet's hosts checks follows what the configuration's runs
need there: Docker for runs with `image:`, and Docker's NVIDIA runtime only when such a run
wants GPUs (a CPU-only container beside the fleet in one apply needs none)."""

from __future__ import annotations

from pathlib import Path

from dstack_plan.config.fleet import SSHConfig
from dstack_plan.project import Project
from dstack_plan.providers.ssh.pins import MemoryHostKeyStore

FLEET = (
    "type: fleet\nname: gpu\nssh_config:\n  user: root\n  identity_file: ~/.ssh/id_ed25519\n"
    "  hosts: [10.0.0.1]\n"
)


def _needs(tmp_path: Path, runs: str) -> tuple[bool, bool]:
    (tmp_path / "fleet.dstack.yml").write_text(FLEET)
    (tmp_path / "runs.dstack.yml").write_text(runs)
    project = Project(tmp_path)
    project.load()
    config = SSHConfig.model_validate({"user": "root", "hosts": ["10.0.0.1"]})
    provider = project.ssh_provider("gpu", config, MemoryHostKeyStore())
    return provider.need_containers, provider.need_gpu_containers


def test_a_cpu_only_container_needs_docker_but_not_its_nvidia_runtime(tmp_path: Path) -> None:
    cpu = "type: task\nname: prep\nimage: busybox\ncommands: [x]\nfleets: [gpu]\n"
    assert _needs(tmp_path, cpu) == (True, False)


def test_a_gpu_container_needs_the_nvidia_runtime(tmp_path: Path) -> None:
    gpu = (
        "type: task\nname: train\nimage: busybox\ncommands: [x]\nfleets: [gpu]\n"
        "resources: {gpu: 1}\n"
    )
    assert _needs(tmp_path, gpu) == (True, True)


def test_processes_need_no_docker(tmp_path: Path) -> None:
    process = "type: task\nname: prep\ncommands: [x]\nfleets: [gpu]\nresources: {gpu: 1}\n"
    assert _needs(tmp_path, process)[0] is False
