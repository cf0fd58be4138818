"""A destroy beside watch wins: watch starts no jobs for a run the state no longer has as the
tick read it, nor while an operation holds the lock (`watch/superseded.py`); and watch's
machines only talk to agents that run (`FleetMachines.start_agents`). No processes."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest

from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.clock import FakeClock
from dstack_plan.config.fleet import SSHConfig
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.providers.local import LocalProvider
from dstack_plan.providers.ssh.hostkeys import MemoryHostKeyStore
from dstack_plan.providers.ssh.models import targets_from_config
from dstack_plan.providers.ssh.provider import SSHProvider
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.state.backend import StateSnapshot
from dstack_plan.state.lock import LockInfo
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.restart import end_attempt, restart_jobs, restart_run
from dstack_plan.watch.superseded import Superseded, moved_on, still_current

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
LATER = T0 + timedelta(seconds=5)
FLEET_SPEC = {
    "type": "fleet",
    "name": "onprem",
    "ssh_config": {"user": "root", "hosts": ["10.0.0.1", "10.0.0.2"]},
}


def _fleet(at: datetime = T0, hosts: tuple[str, ...] = ("10.0.0.1", "10.0.0.2")) -> ResourceState:
    record = FleetRecord(hosts=tuple(HostRecord(name=h, hostname=h) for h in hosts))
    return ResourceState.create(
        "fleet.onprem",
        provider="ssh",
        spec=FLEET_SPEC,
        status="active",
        now=at,
        attributes=record.to_attributes(),
    )


def _run(fleet: str = "onprem", at: datetime = T0) -> ResourceState:
    record = RunRecord(
        fleet=fleet, generation=1, jobs=(JobRecord("j1", host="10.0.0.1", status="failed"),)
    )
    return ResourceState.create(
        "task.long",
        provider="ssh",
        spec={"name": "long"},
        status="failed",
        now=at,
        attributes=record.to_json(),
        depends_on=[f"fleet.{fleet}"],
    )


def _state(*entries: ResourceState, serial: int = 7) -> State:
    state = State.empty().model_copy(update={"serial": serial})
    for entry in entries:
        state = state.with_resource(entry)
    return state


def test_the_tick_may_act_while_nothing_was_committed_since_it_read_the_state() -> None:
    read = _state(_fleet(), _run())
    assert moved_on(read, read, "task.long") is None
    # the serial moved for something else: the run and its fleet are as the tick read them
    other = ResourceState.create("task.other", provider="ssh", spec={}, status="done", now=T0)
    assert moved_on(read, _state(_fleet(), _run(), other, serial=8), "task.long") is None


def test_a_run_or_fleet_destroyed_since_the_tick_read_the_state_is_left_alone() -> None:
    read = _state(_fleet(), _run())
    # destroy deletes the run first, then the fleet: each commit is seen
    assert moved_on(read, _state(_fleet(), serial=8), "task.long") == "it is gone from state"
    assert moved_on(read, _state(serial=9), "task.long") == "it is gone from state"
    assert moved_on(read, _state(_run(), serial=8), "task.long") == (
        "fleet.onprem is gone from state"
    )


def test_a_run_or_fleet_changed_or_tainted_since_is_left_to_the_next_tick() -> None:
    read = _state(_fleet(), _run())
    changed = moved_on(read, _state(_fleet(), _run(at=LATER), serial=8), "task.long")
    assert changed == "it changed since the tick read the state"
    tainted = _run().model_copy(update={"tainted": True})
    assert moved_on(read, _state(_fleet(), tainted, serial=8), "task.long") == (
        "it is being replaced"
    )
    fewer = _fleet(at=LATER, hosts=("10.0.0.2",))  # apply took a host out of the fleet
    assert moved_on(read, _state(fewer, _run(), serial=8), "task.long") == (
        "fleet.onprem changed since the tick read the state"
    )


def test_a_run_on_a_fleet_no_resource_creates_only_needs_its_own_entry() -> None:
    read = _state(_run(fleet="local"))
    assert moved_on(read, _state(_run(fleet="local"), serial=8), "task.long") is None


class _Backend:
    def __init__(self, state: State, holder: LockInfo | None = None) -> None:
        self.state = state
        self.holder = holder
        self.reads = 0

    def read(self) -> StateSnapshot:
        self.reads += 1
        return StateSnapshot(self.state, "v")

    def read_lock_info(self) -> LockInfo | None:
        return self.holder


class _Project:
    """What `still_current` and `restart_*` reach before they start anything."""

    def __init__(self, backend: _Backend) -> None:
        self.backend = backend
        self.clock = FakeClock(T0.timestamp())

    def handlers(self) -> Any:
        raise AssertionError("nothing may be started")


def _lock(operation: str, ttl: float) -> LockInfo:
    clock = FakeClock(T0.timestamp())
    return LockInfo.new(operation=operation, who="x", path="p", ttl=ttl, clock=clock, pid=1)


def test_no_run_is_restarted_once_destroy_removed_it_or_while_destroy_works() -> None:
    read = _state(_fleet(), _run())
    ctx = ApplyContext(state=lambda: read)
    gone = _Project(_Backend(_state(_fleet(), serial=8)))
    project = cast(Any, gone)
    with pytest.raises(Superseded, match="task.long: left for the next tick: it is gone"):
        asyncio.run(restart_run(project, _run(), ctx, read=read))
    with pytest.raises(Superseded, match="it is gone from state"):
        asyncio.run(restart_jobs(project, _run(), ["j1"], ctx, read=read))
    with pytest.raises(Superseded, match="it is gone from state"):  # nothing stopped either
        asyncio.run(end_attempt(project, _run(), ctx, read=read))
    # destroy stops the run's jobs before it removes the entry: the lock tells
    working = cast(Any, _Project(_Backend(read, _lock("destroy", ttl=60))))
    with pytest.raises(Superseded, match="destroy holds the state lock"):
        asyncio.run(restart_run(working, _run(), ctx, read=read))


def test_an_expired_lock_and_an_unmoved_serial_let_watch_act() -> None:
    read = _state(_fleet(), _run())
    backend = _Backend(read, _lock("apply", ttl=-1))
    asyncio.run(still_current(cast(Any, _Project(backend)), read, "task.long"))
    assert backend.reads == 1


def test_watch_machines_only_talk_to_agents_that_run(tmp_path: Path) -> None:
    made: list[SSHProvider] = []

    def make(fleet: str, config: SSHConfig, pins: MemoryHostKeyStore) -> SSHProvider:
        made.append(SSHProvider({fleet: targets_from_config(config)}, host_keys=pins))
        return made[-1]

    machines = FleetMachines(LocalProvider(agent_dir=tmp_path), make)
    assert machines.start_agents and machines.kept_provider(_fleet()).start_agents
    machines.start_agents = False  # as watch sets it: the kept provider follows
    assert not made[0].start_agents
    changed = _fleet(hosts=("10.0.0.1",)).model_copy(
        update={"spec": {**FLEET_SPEC, "ssh_config": {"user": "root", "hosts": ["10.0.0.1"]}}}
    )
    assert machines.kept_provider(changed) is made[1] and not made[1].start_agents
    assert SSHProvider().start_agents  # apply's own providers install and start agents
