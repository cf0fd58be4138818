"""Bandwidth: the gang choice (`scheduler/bandwidth.py`) on measured and estimated links, probe
rounds, the matrix as state keeps it (`FleetRecord.bandwidth`, merged probe by probe), and its
metric in watch."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta, timezone
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.fleets.probe import pair_rounds
from dstack_plan.fleets.records import (
    BandwidthLink,
    BandwidthRecord,
    FleetRecord,
    HostRecord,
)
from dstack_plan.providers.base import MachineResources
from dstack_plan.scheduler.bandwidth import EXACT_LIMIT, GangChoice, LinkMatrix, best_gang
from dstack_plan.scheduler.placement import Candidate, JobDemand, place
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.loop import _bandwidth
from dstack_plan.watch.metrics import WatchMetrics
from dstack_plan.watch.model import TickReport

GB = 1e9
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def test_the_gang_takes_the_faster_pair() -> None:
    matrix = {("a", "b"): 1 * GB, ("a", "c"): 1 * GB, ("b", "c"): 10 * GB}
    choice = best_gang(["a", "b", "c"], 2, matrix)
    assert choice is not None
    assert choice.hosts == ("b", "c") and choice.min_bytes_per_second == 10 * GB
    assert choice.exact


def test_the_slowest_link_decides_not_the_sum() -> None:
    # {a,b,c}: links 100, 100, 1 (sum 201); {a,b,d}: 100, 5, 5 (sum 110): the min wins
    matrix = {("a", "b"): 100.0, ("a", "c"): 100.0, ("b", "c"): 1.0}
    matrix |= {("a", "d"): 5.0, ("b", "d"): 5.0, ("c", "d"): 1.0}
    choice = best_gang(["a", "b", "c", "d"], 3, matrix)
    assert choice is not None and choice.hosts == ("a", "b", "d")
    assert choice.min_bytes_per_second == 5.0


def test_a_link_is_the_slower_of_its_two_directions_and_unknown_ranks_last() -> None:
    matrix = {("a", "b"): 10 * GB, ("b", "a"): 1 * GB, ("c", "d"): 2 * GB}
    choice = best_gang(["a", "b", "c", "d"], 2, matrix)
    assert choice is not None and choice.hosts == ("c", "d")
    # a pair never measured loses to any measured one, and says it is unknown
    choice = best_gang(["x", "a", "b"], 2, {("a", "b"): 1.0})
    assert choice is not None and choice.hosts == ("a", "b")
    unknown = best_gang(["x", "y"], 2, {})
    assert unknown is not None and unknown.min_bytes_per_second is None


def test_rates_within_the_tolerance_leave_the_callers_order_to_decide() -> None:
    # 9.6 and 9.9 GB/s are the same link as far as probes can tell: the first candidates win
    matrix = {("a", "b"): 9.6 * GB, ("c", "d"): 9.9 * GB}
    hosts = ["a", "b", "c", "d"]
    choice = best_gang(hosts, 2, matrix | {(x, y): 9.6 * GB for x, y in combinations(hosts, 2)})
    assert choice is not None and choice.hosts == ("a", "b")
    strict = best_gang(hosts, 2, matrix, tolerance=0.001)
    assert strict is not None and strict.hosts == ("c", "d")


@settings(max_examples=80, deadline=None)
@given(
    base=st.floats(1e6, 1e11),
    noise=st.lists(st.floats(1.0, 1.45), min_size=6, max_size=6),
)
def test_probe_noise_on_alike_hosts_never_overrides_the_callers_order(
    base: float, noise: list[float]
) -> None:
    # four alike hosts whose probes came back up to 45% apart, wherever the rates fall:
    # the caller's first two (its packing choice) win, as they did before anything was measured
    hosts = ["h1", "h2", "h3", "h4"]
    matrix = {pair: base * f for pair, f in zip(combinations(hosts, 2), noise, strict=True)}
    choice = best_gang(hosts, 2, matrix)
    assert choice is not None and choice.hosts == ("h1", "h2")
    # while a link a real throttle slowed (a factor of two and more) still loses
    slowed = matrix | {("h1", "h2"): base / 2.5}
    choice = best_gang(hosts, 2, slowed)
    assert choice is not None and choice.hosts != ("h1", "h2")


def test_too_few_candidates_is_none_and_one_node_needs_no_matrix() -> None:
    assert best_gang(["a", "b"], 3, {}) is None
    assert best_gang(["a", "a", "a"], 2, {}) is None  # distinct hosts only
    single = best_gang(["b", "a"], 1, {})
    assert single is not None and single.hosts == ("b",)


def test_a_large_fleet_goes_greedy_and_still_finds_the_fast_island() -> None:
    hosts = [f"h{i:03d}" for i in range(200)]
    matrix = {(a, b): 1 * GB for a, b in combinations(hosts, 2)}
    island = ["h013", "h077", "h150", "h199"]
    matrix |= {(a, b): 20 * GB for a, b in combinations(island, 2)}
    choice = best_gang(hosts, 4, matrix)
    assert choice is not None and not choice.exact
    assert choice.hosts == tuple(island) and choice.min_bytes_per_second == 20 * GB


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 7),
    size=st.integers(1, 4),
    rates=st.lists(st.one_of(st.none(), st.integers(1, 6)), min_size=21, max_size=21),
)
def test_exact_choice_is_the_best_min_over_all_combinations(
    n: int, size: int, rates: list[int | None]
) -> None:
    hosts = [f"n{i}" for i in range(n)]
    matrix = {
        pair: float(10**rate)
        for pair, rate in zip(combinations(hosts, 2), rates, strict=False)
        if rate is not None
    }
    choice = best_gang(hosts, size, matrix)
    if size > n:
        assert choice is None
        return
    assert choice is not None and len(set(choice.hosts)) == size
    assert choice == best_gang(list(hosts), size, dict(matrix))  # deterministic
    best = {h: max((r for p, r in matrix.items() if h in p), default=None) for h in hosts}

    def link(pair: tuple[str, str]) -> tuple[float, bool]:
        """(rate, measured): a missing pair is the slower of its hosts' fastest links,
        just below a measured link as fast; unknown (-1) when a host has none."""
        if pair in matrix:
            return matrix[pair], True
        a, b = best[pair[0]], best[pair[1]]
        return (-1.0, False) if a is None or b is None else (min(a, b), False)

    def worst(group: tuple[str, ...]) -> tuple[float, bool]:
        return min((link(p) for p in combinations(group, 2)), default=(math.inf, True))

    assert worst(choice.hosts) == max(worst(g) for g in combinations(hosts, size))
    assert EXACT_LIMIT > 35  # every case here is exact


def test_an_unmeasured_pair_is_estimated_from_its_hosts_fastest_links() -> None:
    # what fleet apply measures: one link per host. b, c have fast NICs (their own links say
    # so), the pair b-c was never probed: estimated as the slower of the two, 8 GB/s
    matrix = {("a", "b"): 10 * GB, ("c", "d"): 8 * GB, ("e", "f"): 0.1 * GB}
    choice = best_gang(["e", "b", "c"], 2, matrix)
    assert choice is not None and choice.hosts == ("b", "c")
    assert choice.min_bytes_per_second == 8 * GB and choice.estimated
    # a measured pair is exact: not estimated
    measured = best_gang(["a", "b"], 2, matrix)
    assert measured is not None and not measured.estimated
    assert measured.min_bytes_per_second == 10 * GB
    # a host without any measured link leaves its pairs unknown
    unknown = best_gang(["x", "b"], 2, matrix)
    assert unknown is not None and unknown.min_bytes_per_second is None


def test_a_measured_pair_wins_over_an_estimate_as_fast() -> None:
    # a-c would be estimated at 10 GB/s, as fast as the measured a-b: the measurement wins
    # over the caller's order (it puts c before b); a slower group still loses to an estimate
    matrix = {("a", "b"): 10 * GB, ("c", "d"): 10 * GB}
    choice = best_gang(["a", "c", "b"], 2, matrix)
    assert choice is not None and choice.hosts == ("a", "b") and not choice.estimated
    slow = {("a", "b"): 1 * GB, ("a", "e"): 10 * GB, ("c", "d"): 10 * GB}
    choice = best_gang(["a", "c", "b"], 2, slow)
    assert choice is not None and choice.hosts == ("a", "c") and choice.estimated


def test_a_pair_probed_without_a_result_is_not_estimated() -> None:
    # b and c are fast, but the probe between them failed (a firewall, say): it stays unknown
    rates = {("a", "b"): 10 * GB, ("c", "d"): 10 * GB, ("a", "x"): 1 * GB}
    failed = LinkMatrix(rates, unknown=[("c", "b")])
    choice = best_gang(["b", "c", "x"], 2, failed)
    assert choice is not None and choice.hosts == ("b", "x")
    assert choice.min_bytes_per_second == 1 * GB and choice.estimated
    # a plain mapping has no failed pairs: b-c is estimated then
    plain = best_gang(["b", "c", "x"], 2, rates)
    assert plain is not None and plain.hosts == ("b", "c")
    # but a link through which nothing got through is as good as failed
    zero = best_gang(["b", "c", "x"], 2, {**rates, ("b", "c"): 0.0})
    assert zero is not None and zero.hosts == ("b", "x")


def test_a_gang_of_well_measured_hosts_beats_one_with_a_host_whose_only_link_is_slow() -> None:
    """After a linear probe (h1 sits behind a slow link; h2, paired with it, looks as slow),
    placement takes well-measured hosts, estimating the links between them, over the hosts
    packing lists first."""
    hosts = [f"h{i}" for i in range(1, 7)]
    links = (
        BandwidthLink(src="h1", dst="h2", bytes_per_second=0.05 * GB),
        BandwidthLink(src="h3", dst="h4", bytes_per_second=9 * GB),
        BandwidthLink(src="h5", dst="h6", bytes_per_second=11 * GB),
    )
    matrix = BandwidthRecord(measured_at=NOW, links=links).matrix()
    choice = best_gang(hosts, 3, matrix)
    assert choice is not None and choice.hosts == ("h3", "h4", "h5")
    assert choice.estimated and choice.min_bytes_per_second == 9 * GB
    assert best_gang(hosts, 4, matrix) == GangChoice(("h3", "h4", "h5", "h6"), 9 * GB, True, True)
    # and so does `place`, given the matrix as a fleet's record holds it
    small = ResourcesSpec.model_validate({"cpu": 1, "memory": "0.1GB..", "disk": "1GB.."})
    gang = [JobDemand(f"node {n}", small) for n in range(3)]
    machine = MachineResources(cpus=8, memory_gb=64, disk_gb=200)
    candidates = [Candidate("onprem", "ssh", h, machine) for h in hosts]
    assert [c.host for c in place(gang, candidates, distinct=True).hosts] == hosts[:3]
    decision = place(gang, candidates, distinct=True, bandwidth=matrix)
    assert [c.host for c in decision.hosts] == ["h3", "h4", "h5"]


def test_a_large_sparse_fleet_goes_greedy_on_estimates() -> None:
    # 200 hosts, one measured link each (a linear probe): h013's and h150's pairs are slow,
    # the others fast; a greedy 4-gang keeps off the slow ones
    hosts = [f"h{i:03d}" for i in range(200)]
    slow = {"h012", "h013", "h150", "h151"}
    pairs = zip(hosts[::2], hosts[1::2], strict=True)
    matrix = {(a, b): (0.1 if a in slow else 10.0) * GB for a, b in pairs}
    choice = best_gang(hosts, 4, matrix)
    assert choice is not None and not choice.exact
    assert not slow & set(choice.hosts) and choice.min_bytes_per_second == 10 * GB
    assert choice == best_gang(hosts, 4, dict(matrix))  # deterministic


def test_probe_rounds_cover_each_pair_once_and_never_a_host_twice_in_a_round() -> None:
    for count in range(0, 12):
        rounds = pair_rounds(count)
        pairs = [p for r in rounds for p in r]
        assert sorted(pairs) == list(combinations(range(count), 2))
        for r in rounds:
            used = [h for p in r for h in p]
            assert len(used) == len(set(used))
        assert len(rounds) == (0 if count < 2 else count - 1 + count % 2)


def _as_entry(record: FleetRecord) -> ResourceState:
    return ResourceState.create(
        "fleet.onprem",
        provider="ssh",
        spec={},
        status="active",
        now=NOW,
        attributes=record.to_attributes(),
    )


def _probed(*hosts: str) -> ResourceState:
    links = (
        BandwidthLink(src="h1", dst="h2", bytes_per_second=2 * GB, sent_bytes_per_second=2 * GB),
        BandwidthLink(src="h1", dst="h3", error="cannot connect to h3:1234: refused"),
        BandwidthLink(src="h2", dst="h3", bytes_per_second=1 * GB),
    )
    record = FleetRecord(
        hosts=tuple(HostRecord(name=h, hostname=h, status="idle") for h in hosts),
        bandwidth=BandwidthRecord(measured_at=NOW, links=links),
    )
    return _as_entry(record)


def test_the_matrix_reads_back_from_state_and_keeps_only_the_hosts_that_stay() -> None:
    record = FleetRecord.of(_probed("h1", "h2", "h3"))
    assert record.bandwidth is not None and record.bandwidth.measured_at == NOW
    assert record.bandwidth.matrix() == {("h1", "h2"): 2 * GB, ("h2", "h3"): 1 * GB}
    assert record.bandwidth.links[1].error == "cannot connect to h3:1234: refused"
    smaller = FleetRecord(hosts=record.hosts[1:]).with_bandwidth_of(record)  # h1 removed
    assert smaller.bandwidth is not None
    assert smaller.bandwidth.matrix() == {("h2", "h3"): 1 * GB}
    # never probed: the attributes are what they were before probes existed
    assert "bandwidth" not in FleetRecord(hosts=record.hosts).to_attributes()


def test_the_matrix_lists_failed_pairs_apart_and_each_hosts_fastest_link() -> None:
    record = FleetRecord.of(_probed("h1", "h2", "h3")).bandwidth
    assert record is not None
    matrix = record.matrix()
    assert isinstance(matrix, LinkMatrix) and matrix.unknown == {("h1", "h3")}
    assert record.best_rates() == {"h1": 2 * GB, "h2": 2 * GB, "h3": 1 * GB}


def test_a_probe_merges_into_the_record_pair_by_pair() -> None:
    """Apply probes a few pairs at a time: each probe replaces the links of the pairs it
    measured (in either direction, failed or not), keeps the others with their own time."""
    older = FleetRecord.of(_probed("h1", "h2", "h3")).bandwidth
    assert older is not None
    later = NOW + timedelta(hours=1)
    newer = BandwidthRecord(
        measured_at=later,
        seconds=0.5,
        links=(
            BandwidthLink(src="h3", dst="h1", bytes_per_second=3 * GB, measured_at=later),
            BandwidthLink(src="h2", dst="h3", error="refused", measured_at=later),
            BandwidthLink(src="h3", dst="h4", bytes_per_second=5 * GB, measured_at=later),
        ),
    )
    merged = older.merged(newer)
    assert (merged.measured_at, merged.seconds) == (later, 0.5)
    assert [(x.src, x.dst, x.bytes_per_second, x.measured_at) for x in merged.links] == [
        ("h1", "h2", 2 * GB, NOW),  # not probed again: kept, with the time it was measured
        ("h3", "h1", 3 * GB, later),  # in the place of the failed h1 -> h3
        ("h2", "h3", None, later),  # a pair that stopped connecting shows as such
        ("h3", "h4", 5 * GB, later),
    ]
    assert merged.matrix().unknown == {("h2", "h3")}
    again = FleetRecord.of(_as_entry(FleetRecord(bandwidth=merged)))
    assert again.bandwidth == merged  # the per-link times read back from state


def test_watch_exports_each_measured_link_from_state() -> None:
    state = State(lineage=str(uuid.uuid4()), resources={"fleet.onprem": _probed("h1", "h2")})
    links = _bandwidth(state)
    assert sorted(links) == [("onprem", "h1", "h2", 2 * GB), ("onprem", "h2", "h3", 1 * GB)]
    metrics = WatchMetrics()
    metrics.observe(TickReport(started_at=0.0, duration_s=0.1, leader=True, bandwidth=links))
    found = {
        (s.labels["fleet"], s.labels["src"], s.labels["dst"]): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "dstack_host_bandwidth_bytes_per_second"
    }
    assert found == {("onprem", "h1", "h2"): 2 * GB, ("onprem", "h2", "h3"): 1 * GB}
