"""`dstack top` on an SSH fleet: GPUs, tasks and a host that is down, asked of the agents.

The `gpu` namespace host has a fake `nvidia-smi` with one GPU; a task holding it runs as a
process of that host's agent (no image).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_ssh_fleet import agents_running, remote, write_fleet  # noqa: F401
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh

HOLD_GPU = (
    "type: task\nname: hold\nfleets: [onprem]\nresources:\n  gpu: 1\n"
    'commands: ["sleep 300"]\nstop_duration: 1s\n'
)


def top_hosts(dstack: Dstack) -> dict[str, dict]:
    shown = dstack("top", "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return {h["host"]: h for h in json.loads(shown.stdout)["hosts"]}


def test_top_shows_the_gpu_a_running_task_holds_and_a_host_that_is_down(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    gpu, h1 = ssh_hosts["gpu"].address, ssh_hosts["h1"].address
    write_fleet(project, ssh_hosts, "gpu", "h1")
    (project / "hold.dstack.yml").write_text(HOLD_GPU)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    try:
        wait_for_status(dstack, "task.hold", {"running"}, timeout=60)

        hosts = top_hosts(dstack)
        assert list(hosts) == [gpu, h1]  # no row for this machine: nothing runs on it
        assert hosts[gpu]["fleet"] == "onprem" and hosts[gpu]["agent"] == "ok"
        assert (hosts[gpu]["gpus_used"], hosts[gpu]["gpus_total"]) == (1, 1)
        assert hosts[gpu]["gpu_names"] == ["NVIDIA Fake A100"]
        assert (hosts[gpu]["tasks"], hosts[gpu]["runs"]) == (1, ["hold"])
        assert (hosts[h1]["gpus_used"], hosts[h1]["gpus_total"], hosts[h1]["tasks"]) == (0, 0, 0)
        for host in hosts.values():
            assert 0 < host["memory_percent"] < 100
            assert 0 <= host["cpu_percent"] <= 100

        table = dstack("top")  # not a terminal: one snapshot, as a plain table
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["NODE", "FLEET", "GPUS", "MEM", "CPU", "TASKS"]
        gpu_row = next(line for line in lines if line.startswith(gpu))
        assert "1/1 NVIDIA Fake A100" in gpu_row and gpu_row.endswith("1 (hold)")
        assert next(line for line in lines if line.startswith(h1)).split()[2:3] == ["0/0"]

        ssh_hosts.stop("h1")
        try:
            down = dstack("top")
            hosts = top_hosts(dstack)
        finally:
            ssh_hosts.start("h1")
        assert down.returncode == 0, down.stdout + down.stderr  # one host down is a row
        assert "Traceback" not in down.stdout + down.stderr
        assert f"{h1}: connection to {h1}:22 refused: is sshd running" in down.stdout
        assert hosts[h1]["agent"] == "error" and hosts[h1]["tasks"] is None
        assert "refused" in hosts[h1]["error"]
        assert (hosts[gpu]["gpus_used"], hosts[gpu]["tasks"]) == (1, 1)
    finally:
        destroyed = dstack("destroy", "-y")
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert agents_running(remote) == set()
