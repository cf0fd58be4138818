"""The reachability rule on synthetic ticks (no agents): three failed checks make a host
unreachable, the grace period fails its jobs, the local fleet is never marked."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone
from typing import Any, cast

from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.model import HostSeen
from dstack_plan.watch.reachability import GRACE_S, LOST_KEY, Reachability, without_lost_jobs
from dstack_plan.watch.retry_model import JobOutcome
from dstack_plan.watch.tick import Acted, Tick

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
T0 = 1_800_000_000.0


def _fleet(hosts: list[HostRecord]) -> ResourceState:
    return ResourceState.create(
        "fleet.onprem",
        provider="ssh",
        spec={},
        status="active",
        now=NOW,
        attributes=FleetRecord(hosts=tuple(hosts)).to_attributes(),
    )


def _run(host: str, status: str = "running") -> ResourceState:
    record = RunRecord(
        fleet="onprem", generation=1, jobs=(JobRecord("j1", host=host, status=status),)
    )
    return ResourceState.create(
        "task.train",
        provider="local",
        spec={},
        status=status,
        now=NOW,
        attributes=record.to_json(),
    )


def _refreshed(committed: State, answered: bool) -> State:
    """What the fleet's own refresh makes of the committed state: host records rebuilt
    (watch's fields dropped), `unreachable` at once when the host did not answer."""
    hosts = [
        HostRecord(name=h.name, hostname=h.hostname, status="idle", agent_version="new")
        if answered
        else HostRecord(name=h.name, hostname=h.hostname, status="unreachable", problem="refused")
        for h in FleetRecord.of(committed.resources["fleet.onprem"]).hosts
    ]
    return committed.with_resource(_fleet(hosts))


def _tick(committed: State, now: float, answered: bool, fleet: str = "onprem") -> Acted:
    seen = [HostSeen(fleet=fleet, host="h1", reachable=answered, error=None if answered else "x")]
    tick = Tick(cast(Any, None), _refreshed(committed, answered), committed, now, seen)
    return asyncio.run(Reachability().act(tick))


def _commit(state: State, acted: Acted) -> State:
    for entry in acted.changed.values():
        state = state.with_resource(entry)
    return state


def _host(state: State) -> HostRecord:
    return FleetRecord.of(state.resources["fleet.onprem"]).hosts[0]


def _state() -> State:
    fleet = _fleet([HostRecord(name="h1", hostname="h1", status="idle")])
    return State(
        lineage=str(uuid.uuid4()), resources={"fleet.onprem": fleet, "task.train": _run("h1")}
    )


def test_a_host_is_unreachable_only_at_the_third_failed_check_and_then_fails_its_jobs() -> None:
    state = _state()
    for n in (1, 2):
        acted = _tick(state, T0 + 5 * (n - 1), answered=False)
        state = _commit(state, acted)
        assert (_host(state).status, _host(state).failed_checks) == ("idle", n)
        assert _host(state).unreachable_since == T0
        assert not acted.events
    acted = _tick(state, T0 + 10, answered=False)
    state = _commit(state, acted)
    assert (_host(state).status, _host(state).unreachable_since) == ("unreachable", T0)
    assert [(e.kind, e.old_status, e.new_status) for e in acted.events] == [
        ("host", "idle", "unreachable")
    ]
    assert state.resources["task.train"].status == "running"  # within the grace period

    state = _commit(state, _tick(state, T0 + GRACE_S, answered=False))
    run = state.resources["task.train"]
    assert run.status == "failed"
    assert RunRecord.of(run).jobs[0].status == "failed"
    assert run.attributes[LOST_KEY] == {"j1": T0 + GRACE_S}
    assert _host(state).lost_jobs == ("j1",)
    outcome = JobOutcome.unreachable(RunRecord.of(run).jobs[0], T0 + GRACE_S)
    assert outcome.event == "interruption"
    assert RunRecord.of(without_lost_jobs(run)).jobs == ()  # what a restart deletes


def test_an_answer_resets_the_count() -> None:
    state = _state()
    for now in (T0, T0 + 5):
        state = _commit(state, _tick(state, now, answered=False))
    acted = _tick(state, T0 + 10, answered=True)
    state = _commit(state, acted)
    assert (_host(state).status, _host(state).failed_checks) == ("idle", 0)
    assert _host(state).unreachable_since is None
    assert not acted.events  # it was never marked


def test_the_local_fleet_is_never_marked() -> None:
    state = _state()
    for i in range(5):
        acted = _tick(state, T0 + GRACE_S * i, answered=False, fleet="local")
        assert not acted.changed and not acted.events


def test_a_host_that_answers_tick_after_tick_writes_nothing() -> None:
    state = _state()
    for now in (T0, T0 + 5, T0 + 10):
        acted = _tick(state, now, answered=True)
        fleet = acted.changed["fleet.onprem"]
        # the fleet's refresh rebuilt the record (other facts): the committed one is kept
        assert fleet.attributes == state.resources["fleet.onprem"].attributes
        state = _commit(state, acted)


def test_a_job_given_up_stays_failed_in_its_run_until_a_restart_replaces_it() -> None:
    state = _state()
    for now in (T0, T0 + 5, T0 + 10, T0 + GRACE_S):
        state = _commit(state, _tick(state, now, answered=False))
    # back, its agent still runs the job: the refresh says `running`, the run keeps `failed`
    run = state.resources["task.train"]
    record = RunRecord.of(run)
    running = run.updated(
        now=run.updated_at,
        status="running",
        attributes={
            **run.attributes,
            **record.with_jobs([record.jobs[0]._replace(status="running")]).to_json(),
        },
    )
    # (stopping it on the host is for the real agents of tests/e2e/test_watch_reachability.py)
    host = _host(state).model_copy(update={"lost_jobs": ()})
    back = state.with_resource(running).with_resource(_fleet([host]))
    acted = _tick(back, T0 + GRACE_S + 5, answered=True)
    kept = acted.changed["task.train"]
    assert (kept.status, RunRecord.of(kept).jobs[0].status) == ("failed", "failed")

    # restarted elsewhere (a new job): the run forgets the old one
    restarted = run.updated(
        now=run.updated_at,
        status="running",
        attributes={
            **run.attributes,
            **record.with_jobs([JobRecord("j2", host="h2", status="running")]).to_json(),
        },
    )
    acted = _tick(state.with_resource(restarted), T0 + GRACE_S + 5, answered=False)
    assert LOST_KEY not in acted.changed["task.train"].attributes
    assert acted.changed["task.train"].status == "running"
