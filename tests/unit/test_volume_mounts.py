"""Network volumes in runs: which volume each job mounts, where a run that mounts one may be
placed (its backend, its zone), which volumes jobs use now, and the agent's disk spec."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.agent.disks import DiskError, find_device
from dstack_plan.agent.spec import DiskSpec, SpecError, parse_job_spec
from dstack_plan.config.runs import TaskSpec
from dstack_plan.config.volume import VolumeSpec
from dstack_plan.providers.base import MachineResources
from dstack_plan.runs.placing import HostRun, place_on_fleet
from dstack_plan.runs.volume_mounts import (
    JobVolume,
    VolumeSite,
    job_volumes,
    run_volume_names,
    volume_needs,
    volume_sites,
    volumes_in_use,
)
from dstack_plan.scheduler.labels import Labels
from dstack_plan.scheduler.placement import Candidate
from dstack_plan.state.model import ResourceState, State

NOW = 1_700_000_000.0
MACHINE = MachineResources(cpus=4, memory_gb=16, disk_gb=100)
HOSTS = [Candidate("burst", "aws", f"10.0.0.{i}", MACHINE) for i in (1, 2)]
ZONES: dict[str, Labels] = {
    "10.0.0.1": {"zone": ("us-east-1a",)},
    "10.0.0.2": {"zone": ("us-east-1b",)},
}


def task(name: str = "train", **fields: Any) -> TaskSpec:
    return TaskSpec.model_validate(
        {"type": "task", "name": name, "commands": ["true"], "resources": {"cpu": 1}, **fields}
    )


def state_of(*entries: ResourceState) -> State:
    state = State.empty()
    for entry in entries:
        state = state.with_resource(entry)
    return state


def volume_entry(name: str, zone: str, provider: str = "aws") -> ResourceState:
    attributes = {"provider": provider, "id": f"vol-{name}", "name": name, "region": "us-east-1",
                  "zone": zone, "status": "active"}  # fmt: skip
    return ResourceState.create(
        f"volume.{name}", provider=provider, spec={"name": name}, now=NOW, status="active",
        attributes=attributes,
    )  # fmt: skip


def run_entry(spec: TaskSpec, fleet: str, *jobs: tuple[int, str, str]) -> ResourceState:
    assert spec.name is not None
    records = [{"id": f"j{n}", "node": n, "status": s, "host": h} for n, s, h in jobs]
    return ResourceState.create(
        f"task.{spec.name}", provider="ssh", spec=spec.model_dump(mode="json", exclude_none=True),
        now=NOW, status="running", attributes={"fleet": fleet, "jobs": records},
    )  # fmt: skip


def test_each_node_mounts_its_own_volume_from_a_list_or_by_its_rank() -> None:
    spec = task(
        nodes=2,
        volumes=[
            "shared:/shared",
            {"name": ["ckpt-a", "ckpt-b"], "path": "/ckpt"},
            {"name": "scratch-${{ dstack.node_rank }}", "path": "/scratch"},
            "/mnt/host:/host",  # an instance volume: nothing to attach
        ],
    )
    assert job_volumes(spec, 1) == [
        JobVolume("shared", "/shared"),
        JobVolume("ckpt-b", "/ckpt"),
        JobVolume("scratch-1", "/scratch"),
    ]
    assert run_volume_names(spec) == ["shared", "ckpt-a", "scratch-0", "ckpt-b", "scratch-1"]
    assert run_volume_names(task(volumes=["/a:/b"])) == []


def test_a_run_goes_only_to_its_volumes_backend_and_zone() -> None:
    sites = {"data": VolumeSite("aws", "us-east-1b"), "other": VolumeSite("aws", "us-east-1a")}
    mounting = task(volumes=["data:/data"])
    assert volume_needs(mounting, "burst", "aws", sites).zone == "us-east-1b"
    off = volume_needs(mounting, "onprem", "ssh", sites).never
    assert off == (
        "it mounts the aws volume data, which attaches only to aws machines, and fleet onprem "
        "is an SSH fleet"
    )
    split = volume_needs(task(volumes=["data:/a", "other:/b"]), "burst", "aws", sites).never
    assert split is not None and "different zones (us-east-1a, us-east-1b)" in split
    unknown = volume_needs(task(volumes=["nope:/a"]), "burst", "aws", sites).never
    assert unknown == "it mounts the volume nope, which no configuration declares"

    run = HostRun("task.train", "train", mounting, starts=True)
    placed = place_on_fleet([run], HOSTS, {}, "dep", ZONES, volumes=sites)
    assert placed.placements["task.train"].hosts == ("10.0.0.2",)
    far = HostRun("task.far", "far", task("far", volumes=["other:/o"]), starts=True)
    one_zone = {"10.0.0.2": ZONES["10.0.0.2"]}
    refused = place_on_fleet([far], HOSTS[1:], {}, "dep", one_zone, volumes=sites)
    assert "lacks label zone=us-east-1a (has zone=us-east-1b)" in refused.never["task.far"]


def test_sites_come_from_state_first_then_from_the_configuration() -> None:
    declared = [
        VolumeSpec.model_validate(
            {
                "type": "volume",
                "name": n,
                "backend": "aws",
                "region": "us-east-1",
                "size": 10,
                **extra,
            }
        )
        for n, extra in (("made", {}), ("new", {"availability_zone": "us-east-1c"}))
    ]
    sites = volume_sites(state_of(volume_entry("made", "us-east-1a")), declared)
    assert sites == {
        "made": VolumeSite("aws", "us-east-1a"),  # where it was created
        "new": VolumeSite("aws", "us-east-1c"),
    }


def test_a_volume_is_in_use_only_where_an_unfinished_job_mounts_it() -> None:
    spec = task(nodes=2, volumes=[{"name": ["a", "b"], "path": "/d"}])
    running = run_entry(spec, "burst", (0, "running", "h1"), (1, "done", "h2"))
    plain = run_entry(task("plain"), "burst", (0, "running", "h3"))
    state = state_of(running, plain)
    assert volumes_in_use(state) == {("a", "burst", "h1")}
    assert volumes_in_use(state, excluding={"task.train"}) == set()


def test_the_agent_checks_disks_and_waits_a_bounded_time_for_the_device() -> None:
    base = {"id": "j1", "run_name": "r", "image": "busybox", "commands": ["true"]}
    disk = {"name": "data", "devices": ["/dev/disk/by-id/x", "/dev/sdf"], "container_path": "/d"}
    parsed = parse_job_spec({**base, "disks": [disk]})
    assert parsed.disks == (DiskSpec("data", ("/dev/disk/by-id/x", "/dev/sdf"), "/d"),)
    assert parsed.to_dict()["disks"][0]["devices"] == ["/dev/disk/by-id/x", "/dev/sdf"]
    with pytest.raises(SpecError) as bad:
        parse_job_spec({**base, "disks": [{**disk, "devices": ["/etc/passwd"]}]})
    assert "disks[0].devices" in str(bad.value)
    with pytest.raises(SpecError, match="need an image"):
        parse_job_spec({**base, "image": None, "disks": [disk]})

    now = [0.0]
    with pytest.raises(DiskError, match=r"volume data: no device appeared within 2s"):
        find_device(
            DiskSpec("data", ("/dev/dstack-plan-absent",), "/d"),
            wait=2,
            sleep=lambda s: now.__setitem__(0, now[0] + s),
            clock=lambda: now[0],
        )
