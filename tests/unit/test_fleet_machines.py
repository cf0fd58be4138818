"""An SSH fleet's machines are what the state entry read records (`FleetMachines.machines`),
whichever entry the caller holds: made once per entry, never one entry's for another's. No
processes, no I/O."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

from dstack_plan.config.fleet import SSHConfig
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.providers.local import LocalProvider
from dstack_plan.providers.ssh.hostkeys import MemoryHostKeyStore
from dstack_plan.providers.ssh.models import targets_from_config
from dstack_plan.providers.ssh.provider import SSHProvider
from dstack_plan.state.model import ResourceState, State


def fleet_state(*addresses: str) -> State:
    """A state holding SSH fleet `rack` of hosts `addresses`, as its create records them."""
    record = FleetRecord(
        hosts=tuple(HostRecord(name=a, hostname=a, instance_id=f"ssh:{a}") for a in addresses)
    )
    spec = {"type": "fleet", "name": "rack", "ssh_config": {"user": "u", "hosts": [*addresses]}}
    entry = ResourceState.create(
        "fleet.rack",
        provider="ssh",
        spec=spec,
        status="active",
        now=datetime(2026, 1, 1, tzinfo=timezone.utc),
        attributes=record.to_attributes(),
    )
    return State.empty().with_resource(entry)


def hosts(machines: FleetMachines, state: State) -> list[str]:
    return [m.host for m in asyncio.run(machines.machines("rack", state))]


def test_each_state_gives_the_hosts_its_fleet_entry_records(tmp_path: Path) -> None:
    def make(fleet: str, config: SSHConfig, pins: MemoryHostKeyStore) -> SSHProvider:
        return SSHProvider({fleet: targets_from_config(config)}, host_keys=pins)

    machines = FleetMachines(LocalProvider(agent_dir=tmp_path), make)
    before = fleet_state("10.0.0.1", "10.0.0.2")
    after = fleet_state("10.0.0.1", "10.0.0.2", "10.0.0.3")  # a host added by an apply
    assert hosts(machines, before) == ["10.0.0.1", "10.0.0.2"]
    assert hosts(machines, after) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert hosts(machines, before) == ["10.0.0.1", "10.0.0.2"]  # a watch tick's older read

    found = asyncio.run(machines.machines("rack", after))
    found.clear()  # the caller's own list: the next caller still gets every host
    assert hosts(machines, after) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
