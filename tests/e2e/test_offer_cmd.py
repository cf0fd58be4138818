"""`dstack offer` as a user runs it: this machine (two fake A100s) matched against GPU specs,
its availability as a run takes its GPUs, and a cloud provider's offers (a provider installed
through the entry-point group) cheapest first, whole machines matched on every range."""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401
from tests.e2e.test_ssh_top import HOLD_GPU
from tests.infra.ssh_hosts import SSHTestHosts

NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *memory.total,uuid*)
    echo "0, NVIDIA A100-SXM4-80GB, 81920, GPU-fake-0"
    echo "1, NVIDIA A100-SXM4-80GB, 81920, GPU-fake-1" ;;
  *utilization.gpu*)
    echo "0, 0, 0, 81920"
    echo "1, 0, 0, 81920" ;;
  *) exit 2 ;;
esac
"""
SMALL = ["--cpu", "1..", "--memory", "0.1GB..", "--disk", "1GB.."]

FAKE_CLOUD = """
from dstack_plan.providers.base import GPU, MachineResources, Offer, Provider


def gpus(n, name="NVIDIA A100-SXM4-80GB"):
    return tuple(GPU(vendor="nvidia", name=name, memory_mib=81920) for _ in range(n))


def offer(kind, price, n, availability="available"):
    resources = MachineResources(cpus=12 * n, memory_gb=85 * n, disk_gb=100, gpus=gpus(n))
    return Offer(provider="fakecloud", instance_type=kind, region="eu-1", resources=resources,
                 price_per_hour=price, availability=availability)


class FakeCloud(Provider):
    name = "fakecloud"

    async def offers(self, requirements=None):
        return [offer("a2-8g", 29.4, 8), offer("a2-2g-b", 7.9, 2), offer("a2-2g", 7.3, 2),
                offer("a2-2g-spare", 1.0, 2, "not_available"),
                Offer(provider="fakecloud", instance_type="g2-l4", region="eu-1",
                      resources=MachineResources(cpus=8, memory_gb=32, disk_gb=100,
                                                 gpus=gpus(1, "NVIDIA L4")),
                      price_per_hour=0.7)]

    async def create_instances(self, fleet, offer, count):
        raise NotImplementedError

    async def refresh(self, instances):
        return []

    async def terminate(self, instances):
        return None

    async def agent(self, instance):
        raise NotImplementedError
"""


@pytest.fixture
def gpu_env(cli_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    (tmp_path / "project").mkdir(exist_ok=True)
    return {**cli_env, "PATH": f"{bin_dir}:{cli_env.get('PATH', '/usr/bin:/bin')}"}


@pytest.fixture
def offer_cli(gpu_env: dict[str, str], tmp_path: Path) -> Dstack:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*CLI, *args], cwd=tmp_path / "project", env=env or gpu_env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip

    return run


def offers(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_this_machine_is_offered_when_its_gpus_match_and_said_why_not_otherwise(
    offer_cli: Dstack,
) -> None:
    view = offers(offer_cli("offer", "--gpu", "A100:80GB:2", *SMALL, "--json"))
    assert view["requirements"] == "cpu=1.. mem=0.1GB.. disk=1GB.. gpu=A100:80GB:2"
    [row] = view["offers"]
    assert (row["fleet"], row["provider"], row["availability"]) == ("local", "local", "idle")
    assert row["free_gpus"] == 2 and row["held_by"] == []
    assert [g["name"] for g in row["gpus"]] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert view["notes"] == [
        "no cloud backend is configured (.dstack/backends.yml): fleet hosts only"
    ]

    for gpu, why in [
        ("H100", "needs 1 GPU H100, has none (it has 2 NVIDIA A100-SXM4-80GB)"),
        ("A100:40GB", "needs 1 GPU A100 40GB, has none (it has 2 NVIDIA A100-SXM4-80GB, 80GB)"),
        ("A100:4", "needs 4 GPUs A100, has 2 suitable"),
        ("amd", "needs 1 GPU amd, has none (it has 2 NVIDIA A100-SXM4-80GB, made by nvidia)"),
    ]:
        view = offers(offer_cli("offer", "--gpu", gpu, *SMALL, "--json"))
        assert view["offers"] == []
        assert [(u["fleet"], u["reason"]) for u in view["unmatched"]] == [("local", why)]
    shown = offer_cli("offer", "--gpu", "H100", *SMALL)
    assert shown.returncode == 0, shown.stderr
    assert "No machine matches." in shown.stdout
    assert "needs 1 GPU H100, has none (it has 2 NVIDIA A100-SXM4-80GB)" in shown.stdout


def test_bad_flags_name_the_flag(offer_cli: Dstack) -> None:
    bad = offer_cli("offer", "--memory", "lots")
    assert bad.returncode == 1
    assert bad.stderr.startswith("Error: --memory 'lots': invalid memory")
    assert "Traceback" not in bad.stderr


def test_a_run_holding_gpus_makes_the_host_available_then_busy(
    offer_cli: Dstack, tmp_path: Path
) -> None:
    (tmp_path / "project" / "train.dstack.yml").write_text(
        "type: task\nname: train\ncommands: ['exec sleep 300']\nstop_duration: 1s\n"
        "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: 'A100:1'}\n"
    )
    applied = offer_cli("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    try:
        [one] = offers(offer_cli("offer", "--gpu", "1", *SMALL, "--json"))["offers"]
        assert (one["availability"], one["free_gpus"], one["held_by"]) == (
            "available",
            1,
            ["task.train"],
        )
        [two] = offers(offer_cli("offer", "--gpu", "2", *SMALL, "--json"))["offers"]
        assert two["availability"] == "busy" and two["free_gpus"] == 1
        shown = offer_cli("offer", "--gpu", "2", *SMALL)
        assert "busy, 1 of 2 GPUs free (runs task.train)" in shown.stdout, shown.stdout
    finally:
        assert offer_cli("destroy", "-y").returncode == 0


def test_cloud_offers_are_whole_machines_cheapest_first_unavailable_last(
    offer_cli: Dstack, gpu_env: dict[str, str], tmp_path: Path
) -> None:
    site = tmp_path / "site"
    dist = site / "fakecloud-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakecloud\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[dstack_plan.providers]\nfakecloud = fakecloud:FakeCloud\n"
    )
    (site / "fakecloud.py").write_text(textwrap.dedent(FAKE_CLOUD))
    env = {**gpu_env, "PYTHONPATH": f"{site}:{gpu_env['PYTHONPATH']}"}

    view = offers(offer_cli("offer", "--gpu", "A100:2", *SMALL, "--json", env=env))
    listed = [(r["provider"], r["host"], r["availability"]) for r in view["offers"]]
    assert listed == [
        ("local", socket.gethostname(), "idle"),  # free, and it exists already
        ("fakecloud", "a2-2g", "available"),
        ("fakecloud", "a2-2g-b", "available"),
        ("fakecloud", "a2-2g-spare", "not_available"),
    ]
    assert view["offers"][1]["fleet"] is None and view["offers"][1]["price_per_hour"] == 7.3
    unmatched = {u["host"]: u["reason"] for u in view["unmatched"]}
    # an offer is the whole machine: `A100:2` means two GPUs, not two of eight
    assert unmatched == {
        "fakecloud a2-8g (eu-1)": "needs 2 GPUs A100, has 8 suitable",
        "fakecloud g2-l4 (eu-1)": "needs 2 GPUs A100, has none (it has 1 NVIDIA L4)",
    }
    assert view["notes"] == []

    table = offer_cli("offer", "--gpu", "A100:2", *SMALL, env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert any("a2-2g " in line and "$7.3" in line for line in lines), table.stdout
    assert "fakecloud a2-8g (eu-1): needs 2 GPUs A100, has 8 suitable" in table.stdout


@pytest.mark.ssh
def test_ssh_hosts_are_offered_with_what_runs_on_them_and_unreachable_ones_last(
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
        view = offers(dstack("offer", "--gpu", "1", *SMALL, "--json"))
        [row] = view["offers"]
        assert (row["fleet"], row["host"], row["provider"]) == ("onprem", gpu, "ssh")
        assert (row["availability"], row["free_gpus"], row["held_by"]) == (
            "busy",
            0,
            ["task.hold"],
        )
        reasons = {u["host"]: u["reason"] for u in view["unmatched"] if u["fleet"] == "onprem"}
        assert reasons == {h1: "needs 1 GPU, has none"}

        ssh_hosts.stop("h1")
        try:
            view = offers(dstack("offer", *SMALL, "--json"))
        finally:
            ssh_hosts.start("h1")
        listed = [(r["host"], r["availability"]) for r in view["offers"]]
        assert listed[1:] == [(gpu, "available"), (h1, "unreachable")]
        assert listed[0][1] == "idle"  # this machine: nothing of ours runs on it
        assert "refused" in view["offers"][2]["error"]
    finally:
        destroyed = dstack("destroy", "-y")
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
