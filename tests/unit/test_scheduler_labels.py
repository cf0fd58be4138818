"""Labels and locality: a run's `labels:` exclude the hosts lacking one (and say so), its
`near:` prefers hosts near its storage without excluding the others, `gpu.model` is built
in, `--label` merges into every run, and relabelling an SSH host updates its fleet in place."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dstack_plan.config.fleet import FleetSpec, SSHHost
from dstack_plan.config.label_options import parse_label, with_run_labels
from dstack_plan.config.resource import Desired, Resource, Source
from dstack_plan.config.runs import TaskSpec
from dstack_plan.plan.diff import diff_specs
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.runs.placing import HostRun, place_on_fleet
from dstack_plan.scheduler.labels import (
    Labels,
    Wants,
    choose,
    gpu_model,
    lacks,
    machine_labels,
)
from dstack_plan.scheduler.placement import Candidate, JobDemand, place

SMALL = {"cpu": 1, "memory": "0.1GB..", "disk": "1GB.."}
MACHINE = MachineResources(cpus=4, memory_gb=8, disk_gb=200)
NODES = [Candidate("onprem", "ssh", f"node-0{i}", MACHINE) for i in (1, 2, 3)]
LABELS: dict[str, Labels] = {
    "node-01": {"rack": ("r1",), "zone": ("a",)},
    "node-02": {"rack": ("r2",), "zone": ("a",), "near": ("nfs-a", "nfs-b")},
    "node-03": {"rack": ("r2",)},
}


def task(name: str = "train", **fields: Any) -> TaskSpec:
    data = {"type": "task", "name": name, "commands": ["train"], "resources": SMALL}
    return TaskSpec.model_validate({**data, **fields})


def hosts_of(spec: TaskSpec, labels: dict[str, Labels] = LABELS) -> tuple[str, ...]:
    assert spec.name is not None
    run = HostRun(f"task.{spec.name}", spec.name, spec, starts=True)
    placed = place_on_fleet([run], NODES, {}, "dep", labels)
    return placed.placements[run.address].hosts


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX A6000", "RTXA6000"),
        ("NVIDIA Acme-9 PCIe", "ACME"),  # no model the table knows: its first word
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_gpu_model_is_the_name_configs_use(name: str, model: str) -> None:
    assert gpu_model(name) == model


def test_a_machine_carries_its_entrys_labels_and_its_gpu_model() -> None:
    gpus = (GPU(vendor="nvidia", name="NVIDIA L4"), GPU(vendor="nvidia", name="NVIDIA A10G"))
    machine = MachineResources(cpus=4, memory_gb=8, disk_gb=100, gpus=gpus)
    assert machine_labels(machine, {"rack": ("r1",)}) == {
        "rack": ("r1",),
        "gpu.model": ("A10G", "L4"),
    }
    assert machine_labels(MACHINE, {}) == {}  # no GPUs: no gpu.model


def test_a_required_label_says_what_the_host_has_instead() -> None:
    wants = Wants({"rack": "r1", "zone": "b"})
    assert lacks(wants, LABELS["node-01"]) == "lacks label zone=b (has zone=a)"
    assert lacks(wants, LABELS["node-03"]) == (
        "lacks labels rack=r1 (has rack=r2) and zone=b (no zone label)"
    )
    assert lacks(Wants({"rack": "r2"}), LABELS["node-03"]) is None
    # the built-in model compares as GPU names do: case does not matter
    assert lacks(Wants({"gpu.model": "a100"}), {"gpu.model": ("A100",)}) is None


def test_labels_choose_the_host_and_a_missing_one_is_never_placed_with_why() -> None:
    assert hosts_of(task(labels={"rack": "r1"})) == ("node-01",)
    assert hosts_of(task(labels={"rack": "r2", "zone": "a"})) == ("node-02",)
    run = HostRun("task.tt", "tt", task("tt", labels={"rack": "r9"}), starts=True)
    placed = place_on_fleet([run], NODES, {}, "dep", LABELS)
    assert list(placed.never.values()) == [
        "task.tt cannot run on any fleet: onprem (node-01): lacks label rack=r9 (has rack=r1); "
        "onprem (node-02): lacks label rack=r9 (has rack=r2); "
        "onprem (node-03): lacks label rack=r9 (has rack=r2)"
    ]
    assert placed.placements["task.tt"].note is not None
    assert "lacks label rack=r9" in placed.placements["task.tt"].note


def test_near_prefers_without_excluding() -> None:
    assert hosts_of(task(near="nfs-b")) == ("node-02",)
    # node-02 cannot take 3 distinct nodes alone: the others take the run anyway
    assert sorted(hosts_of(task(near="nfs-a", nodes=3))) == ["node-01", "node-02", "node-03"]
    # nothing near: any host still takes it
    assert hosts_of(task(near="nfs-z")) != ()


def test_a_near_host_too_small_does_not_stop_the_run() -> None:
    big = JobDemand("job", TaskSpec.model_validate(
        {"type": "task", "commands": ["x"], "resources": {"cpu": 8}}
    ).resources)  # fmt: skip
    small = Candidate("f", "ssh", "near", MACHINE)
    large = Candidate("f", "ssh", "far", MachineResources(cpus=16, memory_gb=8, disk_gb=200))
    labels: dict[str, Labels] = {"near": {"near": ("nfs-a",)}}
    decision = choose(
        lambda hosts: place([big], hosts, False), [small, large], Wants(near="nfs-a"), labels
    )
    assert [c.host for c in decision.hosts] == ["far"]


def test_a_run_eligible_hosts_cannot_take_also_names_the_excluded_ones() -> None:
    spec = TaskSpec.model_validate(
        {"type": "task", "commands": ["x"], "resources": {"cpu": 8}, "labels": {"zone": "a"}}
    )
    decision = choose(
        lambda hosts: place([JobDemand("job", spec.resources)], hosts, False),
        NODES,
        Wants.of(spec),
        LABELS,
    )
    assert decision.never and decision.reason is not None
    assert "onprem (node-01): needs 8 CPUs" in decision.reason
    assert "onprem (node-03): lacks label zone=a (no zone label)" in decision.reason


@given(
    wanted=st.dictionaries(st.sampled_from(["rack", "zone"]), st.sampled_from(["r1", "r2", "a"])),
    near=st.none() | st.sampled_from(["nfs-a", "nfs-b", "nfs-z"]),
)
def test_a_placed_run_is_on_hosts_with_every_label_and_near_never_excludes(
    wanted: dict[str, str], near: str | None
) -> None:
    spec = task(labels=wanted or None, near=near)
    hosts = hosts_of(spec)
    for host in hosts:
        assert lacks(Wants(wanted), LABELS[host]) is None
    assert bool(hosts) == (hosts_of(task(labels=wanted or None)) != ())


def test_host_entries_and_runs_check_their_labels() -> None:
    host = SSHHost.model_validate({"hostname": "h", "labels": {"rack": 1, "near": ["a", "b"]}})
    assert host.labels == {"rack": "1", "near": ("a", "b")}
    with pytest.raises(ValidationError, match="'gpu.model' is built in"):
        SSHHost.model_validate({"hostname": "h", "labels": {"gpu.model": "A100"}})
    with pytest.raises(ValidationError, match="invalid label key 'ra ck'"):
        task(labels={"ra ck": "r1"})
    with pytest.raises(ValidationError, match="invalid value 'x y' of label 'near'"):
        task(near="x y")
    assert parse_label("rack=r1") == ("rack", "r1")
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_label("rack")


def test_label_options_add_to_every_runs_labels() -> None:
    source = Source("app.dstack.yml", 0)
    spec = task(labels={"rack": "r1", "zone": "a"})
    desired = Desired({"task.train": Resource("task", "train", spec, source)})
    merged = with_run_labels(desired, {"rack": "r2"})
    assert merged.resources["task.train"].normalized["labels"] == {"rack": "r2", "zone": "a"}
    assert "labels" not in Resource("task", "tt", task("tt"), source).normalized  # old states


def test_relabelling_a_kept_ssh_host_updates_the_fleet_in_place() -> None:
    def fleet(labels: dict[str, str]) -> dict[str, Any]:
        spec = FleetSpec.model_validate(
            {
                "type": "fleet",
                "ssh_config": {"user": "root", "hosts": [{"hostname": "h1", "labels": labels}]},
            }
        )
        return spec.model_dump(mode="json", exclude_none=True)

    diff = diff_specs("fleet", fleet({"rack": "r1"}), fleet({"rack": "r2"}))
    assert diff.changed == ("ssh_config.hosts",) and diff.forces_replacement == ()
