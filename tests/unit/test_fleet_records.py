"""SSH fleet records in state and which fleets the fleet handler takes (no hosts needed)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.fleets.ssh import FleetHandler
from dstack_plan.inspect.fleets import fleet_records, fleets_json, host_rows
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.state.model import ResourceState, State

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def fleet_entry(hosts: list[object]) -> ResourceState:
    return ResourceState.create(
        "fleet.onprem",
        provider="ssh",
        spec={"name": "onprem", "ssh_config": {"hosts": [{"hostname": "10.0.0.1"}]}},
        now=NOW,
        status="active",
        attributes={"hosts": hosts},
    )


def unused_factory(*args: object) -> object:
    raise AssertionError("no provider is needed to answer")


def test_ssh_fleets_are_created_and_cloud_fleets_still_refused() -> None:
    handler = FleetHandler(unused_factory, unused_factory)  # type: ignore[arg-type]
    assert handler.cannot_create("fleet", "ssh") is None
    assert handler.cannot_create("fleet", "cloud") == (
        "the cloud provider cannot create fleets in this version"
    )


def test_a_record_round_trips_and_a_broken_host_entry_is_skipped() -> None:
    gpu = GPU(vendor="nvidia", name="A100", memory_mib=81920)
    host = HostRecord(
        name="10.0.0.1",
        hostname="10.0.0.1",
        status="idle",
        resources=MachineResources(cpus=8, memory_gb=64, disk_gb=100, gpus=(gpu,)),
        agent_version="0.1.0",
        host_key="ssh-ed25519 AAAA",
    )
    record = FleetRecord(hosts=(host,))
    entry = fleet_entry([*record.to_attributes()["hosts"], {"hostname": 3}])
    assert FleetRecord.of(entry) == record
    assert record.pins() == {"10.0.0.1": "ssh-ed25519 AAAA"}
    records = fleet_records(State.empty().with_resource(entry))
    answered = {("onprem", "10.0.0.1"): 0}  # its agent lists no job
    assert host_rows(records, answered) == [
        ["onprem", "10.0.0.1", "idle", "1xA100", "8", "64GB", "100GB", "0.1.0"]
    ]
    assert fleets_json(records, answered)["fleets"][0]["status"] == "active"


def test_a_host_with_a_problem_makes_the_fleet_degraded() -> None:
    host = HostRecord(name="h", hostname="h", status="unreachable", problem="h: refused")
    assert FleetRecord(hosts=(host,)).status == "degraded"
    assert host_rows({"f": FleetRecord(hosts=(host,))}, {})[0][2] == "unreachable: h: refused"


def test_an_unknown_fleet_name_is_a_clear_error() -> None:
    state = State.empty().with_resource(fleet_entry([]))
    with pytest.raises(DstackPlanError, match=r"no fleet 'gpus' in the state \(fleets: onprem\)"):
        fleet_records(state, "gpus")
