"""Fleet apply's bandwidth probe (`fleets/apply_probe.py`): a linear number of pairs, one per
unmeasured host, all at once under a time budget, merged into what the fleet had; and the
probe underneath (`fleets/probe.py`: `probe_pairs`, `probe_fleet` narrowed to given pairs,
`record_bandwidth` merging)."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from dstack_plan.agent.api_models import ProbeListener, ProbeMeasure
from dstack_plan.clock import FakeClock
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets import apply_probe
from dstack_plan.fleets.apply_probe import (
    ApplyPairs,
    PairScope,
    apply_pairs,
    needs_probe,
    partner,
    probed,
)
from dstack_plan.fleets.machines import FleetMachines, Machine
from dstack_plan.fleets.probe import probe_fleet, probe_pairs, record_bandwidth
from dstack_plan.fleets.records import BandwidthLink, BandwidthRecord, FleetRecord, HostRecord
from dstack_plan.providers.base import Instance, MachineResources
from dstack_plan.state.backend import ABSENT
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.model import ResourceState, State

GB = 1e9
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
FLEET = "onprem"


def _all_pairs(plan: ApplyPairs, hosts: Sequence[str], best: dict[str, float]) -> list[tuple]:
    """Every pair the plan probes, the second round's with the partner it would get."""
    pairs = list(plan.first)
    if plan.left is not None:
        pairs.append((partner(hosts, best, plan.left), plan.left))
    return pairs


def _disjoint(pairs: Sequence[tuple[str, str]]) -> bool:
    used = [h for p in pairs for h in p]
    return len(used) == len(set(used))


def test_apply_probes_at_most_half_as_many_pairs_as_hosts_and_covers_every_host() -> None:
    for n in range(0, 70):
        hosts = [f"h{i:02d}" for i in range(n)]
        plan = apply_pairs(hosts, {})
        pairs = _all_pairs(plan, hosts, {})
        assert len(pairs) <= math.ceil(n / 2)  # linear, where every pair is n(n-1)/2
        assert {h for p in pairs for h in p} == (set(hosts) if n >= 2 else set())
        assert _disjoint(plan.first)  # one round: all at once, no NIC shared
        assert (plan.left is not None) == (n >= 3 and n % 2 == 1)  # odd: one more pair


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(2, 40),
    measured=st.lists(st.one_of(st.none(), st.integers(1, 5)), min_size=40, max_size=40),
)
def test_every_unmeasured_host_gets_one_pair_and_never_more_than_half_the_hosts(
    n: int, measured: list[int | None]
) -> None:
    hosts = [f"h{i:02d}" for i in range(n)]
    best = {h: float(10**r) for h, r in zip(hosts, measured, strict=False) if r is not None}
    new = [h for h in hosts if h not in best]
    plan = apply_pairs(hosts, best)
    pairs = _all_pairs(plan, hosts, best)
    assert len(pairs) <= math.ceil(n / 2)
    assert _disjoint(plan.first)
    first = {h for p in plan.first for h in p}
    assert all((h in first) != (h == plan.left) for h in new)  # one pair each
    assert {h for p in pairs for h in p} >= set(new)
    if not new:
        assert plan == ApplyPairs(())


def test_hosts_added_to_a_measured_fleet_are_each_probed_against_a_fast_existing_host() -> None:
    hosts = ["a", "b", "c", "d", "new1", "new2"]
    best = {"a": 1 * GB, "b": 10 * GB, "c": 10 * GB, "d": 5 * GB}
    assert apply_pairs(hosts, best) == ApplyPairs((("b", "new1"), ("c", "new2")))
    # more new hosts than measured ones: the new pair up, the odd one with the fastest
    more = ["a", "n1", "n2", "n3"]
    assert apply_pairs(more, {"a": GB}) == ApplyPairs((("n1", "n2"), ("a", "n3")))
    # nothing measured and odd: the last host waits for the first round's best-linked host
    assert apply_pairs(["x", "y", "z"], {}) == ApplyPairs((("x", "y"),), "z")
    assert partner(["x", "y", "z"], {"y": GB, "x": GB / 2}, "z") == "y"
    assert partner(["x", "y", "z"], {}, "z") == "x"
    assert apply_pairs(["solo"], {}) == ApplyPairs(())


def _host(name: str, problem: str | None = None) -> HostRecord:
    return HostRecord(name=name, hostname=name, status="idle", problem=problem)


def _link(src: str, dst: str, rate: float | None) -> BandwidthLink:
    error = None if rate is not None else "cannot connect"
    return BandwidthLink(src=src, dst=dst, bytes_per_second=rate, error=error, measured_at=NOW)


def _fleet(hosts: Sequence[HostRecord], *links: BandwidthLink) -> FleetRecord:
    bandwidth = BandwidthRecord(measured_at=NOW, links=links) if links else None
    return FleetRecord(hosts=tuple(hosts), bandwidth=bandwidth)


def test_a_probe_is_needed_while_a_usable_host_has_no_measured_link() -> None:
    a, b, c = _host("a"), _host("b"), _host("c")
    assert needs_probe(_fleet([a, b]))
    assert not needs_probe(_fleet([a]))
    assert not needs_probe(_fleet([a, b], _link("a", "b", GB)))
    assert not needs_probe(_fleet([a, b, c], _link("a", "b", GB), _link("b", "c", GB)))
    # a sparse matrix is enough: c measured against b, a-c never probed
    assert needs_probe(_fleet([a, b, c], _link("a", "b", GB)))  # c added
    assert needs_probe(_fleet([a, b, c], _link("a", "b", GB), _link("b", "c", None)))
    # a host with a problem is not probed: it does not make the fleet need one
    assert not needs_probe(_fleet([a, b, _host("c", "unreachable")], _link("a", "b", GB)))


class FakeProber:
    """The project's prober as apply sees it: measures the pairs it is given (rates by
    pair), and records each call's scope."""

    def __init__(self, rates: dict[frozenset[str], float | None]):
        self.rates = rates
        self.scopes: list[PairScope] = []

    async def __call__(self, fleet: str, state: State, scope: PairScope) -> BandwidthRecord:
        assert fleet == FLEET and f"fleet.{fleet}" in state.resources
        self.scopes.append(scope)
        links = tuple(_link(s, d, self.rates.get(frozenset((s, d)))) for s, d in scope.pairs)
        return BandwidthRecord(measured_at=NOW, seconds=0.5, links=links)


def _apply(
    prober: Callable[[str, State, PairScope], Awaitable[BandwidthRecord]] | None,
    record: FleetRecord,
    **kw: Any,
) -> tuple[FleetRecord, list[str]]:
    said: list[str] = []
    entry = apply_probe.entry_for(f"fleet.{FLEET}", {}, record, FakeClock())
    state = State(lineage=str(uuid.uuid4()))
    done = asyncio.run(probed(prober, record, entry, state, said.append, **kw))
    return done, said


def _pairs(record: FleetRecord) -> dict[tuple[str, str], float | None]:
    assert record.bandwidth is not None
    return {(x.src, x.dst): x.bytes_per_second for x in record.bandwidth.links}


def test_a_new_fleet_probes_one_round_of_pairs_and_an_odd_host_against_the_best() -> None:
    hosts = [_host(h) for h in ("h1", "h2", "h3", "h4", "h5")]
    prober = FakeProber(
        {
            frozenset(("h1", "h2")): 0.05 * GB,  # h1 is behind a slow link
            frozenset(("h3", "h4")): 10 * GB,
            frozenset(("h3", "h5")): 9 * GB,
        }
    )
    done, said = _apply(prober, _fleet(hosts))
    assert [s.pairs for s in prober.scopes] == [(("h1", "h2"), ("h3", "h4")), (("h3", "h5"),)]
    assert all(s.parallelism == apply_probe.APPLY_PARALLELISM for s in prober.scopes)
    assert _pairs(done) == {("h1", "h2"): 0.05 * GB, ("h3", "h4"): 10 * GB, ("h3", "h5"): 9 * GB}
    assert said[0].startswith("measuring the bandwidth of 5 host(s): 3 pair(s) at once")


def test_hosts_added_later_are_probed_against_one_existing_host_each() -> None:
    hosts = [_host(h) for h in ("a", "b", "c", "d", "e", "f")]
    old = (_link("a", "b", 1 * GB), _link("c", "d", 10 * GB))
    prober = FakeProber({frozenset(("c", "e")): 10 * GB, frozenset(("d", "f")): None})
    done, _ = _apply(prober, _fleet(hosts, *old))
    assert [s.pairs for s in prober.scopes] == [(("c", "e"), ("d", "f"))]
    assert _pairs(done) == {
        ("a", "b"): 1 * GB,  # kept: measured before
        ("c", "d"): 10 * GB,
        ("c", "e"): 10 * GB,
        ("d", "f"): None,  # recorded unknown with why; the apply goes on
    }
    # the next apply probes again only the host whose probe failed, against the fastest
    again = FakeProber({frozenset(("c", "f")): 10 * GB})
    done, _ = _apply(again, done)
    assert [s.pairs for s in again.scopes] == [(("c", "f"),)]
    # d-f keeps its failure: that pair stays unknown, never estimated
    assert _pairs(done)[("c", "f")] == 10 * GB and _pairs(done)[("d", "f")] is None
    # every host measured: an apply that changes nothing else does not probe
    idle = FakeProber({})
    assert _apply(idle, done)[0] == done and idle.scopes == []


def test_a_probe_that_fails_or_hangs_never_fails_the_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = _fleet([_host("a"), _host("b")])

    async def broken(fleet: str, state: State, scope: PairScope) -> BandwidthRecord:
        raise DstackPlanError("the agent is too old for probes")

    done, said = _apply(broken, record)
    assert done == record and said[-1] == "bandwidth not measured: the agent is too old for probes"

    async def silent(fleet: str, state: State, scope: PairScope) -> BandwidthRecord:
        await asyncio.Event().wait()  # a prober that does not keep to the budget
        raise AssertionError("unreachable")

    monkeypatch.setattr(apply_probe, "BUDGET_GRACE", 0.0)
    done, said = _apply(silent, record, budget=0.01)
    assert done == record and said[-1] == "bandwidth not measured: no result within 0.01s"
    assert _apply(None, record)[0] == record  # no prober: nothing measured


# -- the probe underneath, with fake agents


class FakeAgent:
    """A host's agent: listens and sends at once, unless its host is told to hang or to
    wait for every sender (`gate`)."""

    def __init__(self, host: str, world: FakeWorld):
        self.host = host
        self.world = world

    async def probe_listen(self, address: str | None, max_bytes: int) -> ProbeListener:
        return ProbeListener(id=self.host, address=address or "", port=1, token=SecretStr("t"))

    async def probe_send(
        self, to: ProbeListener, address: str, seconds: float, max_bytes: int
    ) -> ProbeMeasure:
        self.world.sending.add(self.host)
        if self.host in self.world.hang:
            await asyncio.Event().wait()
        if self.world.gate is not None:  # every sender must be sending at once to go on
            if len(self.world.sending) == self.world.gate:
                self.world.all_in.set()
            await self.world.all_in.wait()
        return ProbeMeasure(bytes=1000, seconds=seconds, bytes_per_second=GB)

    async def probe_result(self, probe_id: str, wait: int = 10) -> ProbeMeasure:
        return ProbeMeasure(bytes=1000, seconds=0.5, bytes_per_second=GB, status="done")


class FakeWorld:
    """`FleetMachines` over fake agents: hosts, who hangs, and who got to send."""

    def __init__(self, hosts: Sequence[str], hang: Sequence[str] = (), gate: int | None = None):
        self.hosts = list(hosts)
        self.hang = set(hang)
        self.gate = gate
        self.all_in = asyncio.Event()
        self.sending: set[str] = set()

    async def machines(self, fleet: str, state: State) -> list[Machine]:
        resources = MachineResources(cpus=1, memory_gb=1, disk_gb=1)
        return [
            Machine(
                fleet=fleet,
                provider="ssh",
                host=h,
                address=h,
                instance=Instance(provider="ssh", id=f"ssh:{h}", name=h, fleet=fleet, hostname=h),
                resources=resources,
            )
            for h in self.hosts
        ]

    async def agent(self, fleet: str, host: str, state: State) -> FakeAgent:
        return FakeAgent(host, self)


def _run_pairs(
    world: FakeWorld, pairs: Sequence[tuple[str, str]], budget: float
) -> BandwidthRecord:
    machines = cast(FleetMachines, world)
    state = State(lineage=str(uuid.uuid4()))
    return asyncio.run(
        probe_pairs(machines, FLEET, state, FakeClock(), pairs, budget=budget, seconds=0.5)
    )


def test_probe_pairs_runs_every_pair_at_once() -> None:
    hosts = [f"h{i}" for i in range(10)]
    pairs = list(zip(hosts[::2], hosts[1::2], strict=True))

    async def run() -> BandwidthRecord:
        # each sender waits until all five send: done only if they run together
        world = FakeWorld(hosts, gate=len(pairs))
        state = State(lineage=str(uuid.uuid4()))
        machines = cast(FleetMachines, world)
        return await probe_pairs(machines, FLEET, state, FakeClock(), pairs, budget=60)

    record = asyncio.run(run())
    assert [(x.src, x.dst) for x in record.links] == pairs
    assert all(x.bytes_per_second == GB and x.measured_at is not None for x in record.links)


def test_a_pair_not_done_within_the_budget_is_unknown_with_why() -> None:
    world = FakeWorld(["a", "b", "c", "d", "e", "f"], hang=["c"])
    record = _run_pairs(world, [("a", "b"), ("c", "d"), ("e", "nowhere")], budget=1.0)
    got = {(x.src, x.dst): x for x in record.links}
    assert got[("a", "b")].bytes_per_second == GB
    assert got[("c", "d")].bytes_per_second is None
    assert got[("c", "d")].error == "not measured within the probe's 1s budget"
    assert got[("e", "nowhere")].error == "not probed: nowhere is not a host of fleet 'onprem'"
    with pytest.raises(ValueError, match="must not share a host"):
        _run_pairs(world, [("a", "b"), ("b", "c")], budget=1.0)


def test_probe_fleet_measures_every_pair() -> None:
    hosts = ["a", "b", "c", "d"]
    machines = cast(FleetMachines, FakeWorld(hosts))
    state = State(lineage=str(uuid.uuid4()))
    full = asyncio.run(probe_fleet(machines, FLEET, state, FakeClock(), seconds=0.5))
    assert len(full.links) == 6 and all(x.bytes_per_second for x in full.links)


def test_fleet_probe_merges_into_the_recorded_matrix(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    record = _fleet([_host("a"), _host("b"), _host("c")], _link("a", "b", GB), _link("a", "c", GB))
    entry = ResourceState.create(
        f"fleet.{FLEET}",
        provider="ssh",
        spec={},
        status="active",
        now=NOW,
        attributes=record.to_attributes(),
    )
    backend.write(State(lineage=str(uuid.uuid4()), resources={entry.address: entry}), ABSENT)
    later = datetime(2026, 12, 2, tzinfo=timezone.utc)
    fresh = BandwidthRecord(
        measured_at=later,
        links=(_link("b", "c", 2 * GB), _link("c", "a", None)),
    )
    asyncio.run(record_bandwidth(backend, FLEET, fresh, FakeClock()))
    stored = backend.read().state.get(f"fleet.{FLEET}")
    assert stored is not None
    merged = FleetRecord.of(stored).bandwidth
    assert merged is not None and merged.measured_at == later
    assert {(x.src, x.dst): x.bytes_per_second for x in merged.links} == {
        ("a", "b"): GB,
        ("c", "a"): None,
        ("b", "c"): 2 * GB,
    }
