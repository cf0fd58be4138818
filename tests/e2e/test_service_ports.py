"""Service replicas never clash on one host, and plan says plainly what cannot run (never) or
what must wait (pending), through the CLI on the local fleet with a real agent."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack, fake_nvidia_smi, gpu_cli
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.infra.http_probe import fetch

FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *memory.total,uuid*)
    echo "0, NVIDIA Fake A100, 81920, GPU-fake-0"
    echo "1, NVIDIA Fake A100, 81920, GPU-fake-1" ;;
  *utilization.gpu*)
    echo "0, 0, 0, 81920"
    echo "1, 0, 0, 81920" ;;
  *) exit 2 ;;
esac
"""


def httpd_service(image: str, replicas: int | str) -> str:
    """Service `web`: busybox httpd on 8799 answering `replica-N` from each replica
    (`replicas`: a count, or a range such as `0..2`)."""
    return (
        f"type: service\nname: web\nimage: {image}\nport: 8799\nreplicas: {replicas}\n"
        "stop_duration: 1s\ncommands:\n  - mkdir -p /www\n"
        "  - echo replica-$DSTACK_REPLICA_NUM > /www/index.html\n"
        f"  - exec httpd -f -p 8799 -h /www\n{RESOURCES}"
    )


def agent_jobs(agent_dir: Path) -> list[str]:
    jobs = agent_dir / "jobs"
    return sorted(p.name for p in jobs.iterdir()) if jobs.exists() else []


@pytest.mark.docker
def test_container_replicas_of_one_port_each_listen_on_their_own_host_port(
    dstack: Dstack, tmp_path: Path, docker_client: Any
) -> None:
    from tests.infra.docker_images import ensure_busybox_image

    image = ensure_busybox_image(docker_client)
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(httpd_service(image, replicas=2))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    row = wait_for_status(dstack, "service.web", {"running"})
    assert [j["status"] for j in row["jobs"]] == ["running", "running"]
    ports = [j["ports"] for j in row["jobs"]]
    assert [[(p["container_port"], p["host_ip"]) for p in listed] for listed in ports] == [
        [(8799, "127.0.0.1")]
    ] * 2
    host_ports = [listed[0]["host_port"] for listed in ports]
    assert len(set(host_ports)) == 2
    assert [fetch(port) for port in host_ports] == ["replica-0", "replica-1"]
    table = dstack("ps").stdout
    for port in host_ports:
        assert f"127.0.0.1:{port} -> 8799" in table
    recorded = state(project)["resources"]["service.web"]["attributes"]["jobs"]
    assert [r["ports"][0]["host_port"] for r in recorded] == host_ports
    assert dstack("plan", "--detailed-exitcode").returncode == 0
    assert dstack("destroy", "-y").returncode == 0


def process_service(name: str, port: int, replicas: int = 1) -> str:
    return (
        f"type: service\nname: {name}\nport: {port}\nreplicas: {replicas}\n"
        f"stop_duration: 1s\ncommands: ['exec sleep 300']\n{RESOURCES}"
    )


def test_process_replicas_of_one_port_cannot_be_placed_and_nothing_starts(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(process_service("web", 18811, replicas=2))
    host = socket.gethostname()
    planned = dstack("plan")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert (
        f"service.web cannot run on any fleet: local ({host}): replica 1: port 18811 is "
        f"already used on {host} by replica 0"
    ) in planned.stderr
    assert "give the run an `image:`" in planned.stderr and "Traceback" not in planned.stderr
    applied = dstack("apply", "-y")
    assert applied.returncode == 1 and "cannot run on any fleet" in applied.stderr
    assert agent_jobs(agent_dir) == []
    assert not (project / ".dstack" / "state.json").exists() or not state(project)["resources"]


def test_a_port_held_by_another_run_makes_the_new_one_pending(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(process_service("web", 18812))
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "service.web", {"running"})
    (project / "api.dstack.yml").write_text(process_service("api", 18812))
    host = socket.gethostname()
    planned = dstack("plan", "--json")
    changes = {c["address"]: c for c in json.loads(planned.stdout)["resource_changes"]}
    placement = changes["service.api"]["placement"]
    assert (placement["placed"], placement["pending"]) == (False, True)
    assert placement["note"] == (
        f"pending: waits for port 18812 on local ({host}), used by service.web"
    )
    assert changes["service.web"]["placement"]["placed"] is True  # its own port, kept
    applied = dstack("apply", "-y")
    assert applied.returncode == 1
    assert "pending: waits for port 18812" in applied.stderr
    assert len(agent_jobs(agent_dir)) == 1  # only web's
    assert dstack("destroy", "-y").returncode == 0


@pytest.fixture
def gpu_dstack(cli_env: dict[str, str], tmp_path: Path) -> Dstack:
    """`dstack` whose agent sees two fake A100s (a fake nvidia-smi first on PATH)."""
    bin_dir = fake_nvidia_smi(tmp_path / "fake-bin", FAKE_NVIDIA_SMI)
    return gpu_cli(cli_env, tmp_path / "project", bin_dir)


def gpu_task(name: str, gpu: str) -> str:
    return (
        f"type: task\nname: {name}\ncommands: ['exec sleep 300']\nstop_duration: 1s\n"
        f"resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: '{gpu}'}}\n"
    )


def test_gpus_no_host_has_are_a_plan_error_and_busy_ones_make_a_run_pending(
    gpu_dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    host = socket.gethostname()
    (project / "train.dstack.yml").write_text(gpu_task("train", "H100:80GB:8"))
    (project / "big.dstack.yml").write_text(gpu_task("big", "A100:4"))
    never = gpu_dstack("plan")
    assert never.returncode == 1, never.stdout + never.stderr
    assert (
        f"task.big cannot run on any fleet: local ({host}): needs 4 GPUs A100, "
        "has 2 suitable\n"
        f"task.train cannot run on any fleet: local ({host}): needs 8 GPUs H100 80GB, "
        "has none (it has 2 NVIDIA Fake A100)"
    ) in never.stderr

    (project / "big.dstack.yml").unlink()
    (project / "train.dstack.yml").write_text(gpu_task("other", "A100:2"))
    assert gpu_dstack("apply", "-y").returncode == 0
    (project / "more.dstack.yml").write_text(gpu_task("train", "2"))
    pending = gpu_dstack("plan", "--detailed-exitcode")
    assert pending.returncode == 2, pending.stdout + pending.stderr
    assert "pending: waits for 2 GPUs on local, busy with task.other" in pending.stdout
    applied = gpu_dstack("apply", "-y")
    assert applied.returncode == 1
    assert "pending: waits for 2 GPUs on local, busy with task.other" in applied.stderr
    assert len(agent_jobs(agent_dir)) == 1  # only task.other's
    assert gpu_dstack("destroy", "-y").returncode == 0
