"""Measure a fleet's links when apply provisions it: one pair per new host, all at once.

A fleet apply never waits for an all-pairs matrix (that is `dstack fleet probe`, N - 1 rounds
for N hosts). It probes only hosts without a measured link (a new fleet's, or hosts added), in
one round of disjoint pairs (`apply_pairs`: at most ceil(N / 2) pairs, no host in two, so no
probe shares a NIC), all at once, for `APPLY_PROBE_SECONDS` each, within `APPLY_PROBE_BUDGET`
in all. Its time is about one probe and the connections, whatever the number of hosts. The
links it leaves unmeasured, the gang choice estimates from the hosts' measured ones
(`scheduler/bandwidth.py`). It never fails an apply: a pair that cannot be measured, or is
not done within the budget, is recorded unknown with why.

The prober is the project's `(fleet, state, pairs)` callable that runs `fleets/probe.py`'s
`probe_pairs`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dstack_plan.clock import Clock
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.records import BandwidthLink, BandwidthRecord, FleetRecord
from dstack_plan.state.model import ResourceState, State, timestamp

APPLY_PROBE_SECONDS = 0.5
"""Per pair: long enough for TCP to leave slow start on a LAN, short enough for an apply."""
APPLY_PROBE_BUDGET = 10.0
"""Seconds all of an apply's probing may take (connections, every pair, the second round of
an odd fleet): typically one probe and the connections, about a second or two; a pair not
done by then is recorded unknown, so no apply waits longer on a slow or silent host."""
BUDGET_GRACE = 5.0
"""Seconds past the budget before apply gives up on a prober that does not keep to it (the
project's does: it records the pairs not done as unknown at the budget)."""
APPLY_PARALLELISM = 32
"""Most pairs probed at once (each holds two SSH channels of the controller): a fleet of up
to 64 new hosts is probed in one go, a larger one in waves within the same budget."""

Prober = Callable[[str, State, "PairScope"], Awaitable[BandwidthRecord]]
"""(fleet name, a state holding its entry, the pairs to measure) -> the links measured
(`probe.probe_pairs`)."""

Pair = tuple[str, str]


@dataclass(frozen=True)
class PairScope:
    """What apply's prober measures: `pairs` ((src, dst) host names, no host in two: they run
    at once, at most `parallelism` together), all within `budget` seconds
    (`probe.probe_pairs`)."""

    pairs: tuple[Pair, ...]
    budget: float
    parallelism: int = APPLY_PARALLELISM


class ApplyPairs(NamedTuple):
    """The pairs an apply probes: `first`, one round of disjoint pairs, and `left`, the host
    of an odd fleet with nothing measured that the first round could not pair (probed next,
    against the best-linked host the first round found)."""

    first: tuple[Pair, ...]
    left: str | None = None

    def pairs(self) -> int:
        """How many pairs in all."""
        return len(self.first) + (self.left is not None)


def apply_pairs(hosts: Sequence[str], best: Mapping[str, float]) -> ApplyPairs:
    """The pairs to probe so every host of `hosts` has a measured link, given `best` (host ->
    its fastest measured link; a host absent has none): at most ceil(N / 2) pairs.

    Hosts added to a measured fleet (no more of them than of measured hosts) are each probed
    against a measured host of their own, the fastest first: a fast partner leaves the new
    host's own NIC as what the link shows. Otherwise the new hosts are paired with each other
    in order, an odd one out with the fastest measured host, or, when none is, left for a
    second round (`ApplyPairs.left`)."""
    if len(hosts) < 2:
        return ApplyPairs(())
    order = {h: i for i, h in enumerate(hosts)}
    new = [h for h in hosts if h not in best]
    known = sorted((h for h in hosts if h in best), key=lambda h: (-best[h], order[h]))
    if len(new) <= len(known):
        return ApplyPairs(tuple(zip(known[: len(new)], new, strict=True)))
    pairs = [(new[i], new[i + 1]) for i in range(0, len(new) - 1, 2)]
    if len(new) % 2 == 0:
        return ApplyPairs(tuple(pairs))
    if known:
        return ApplyPairs((*pairs, (known[0], new[-1])))
    return ApplyPairs(tuple(pairs), new[-1])


def partner(hosts: Sequence[str], best: Mapping[str, float], left: str) -> str:
    """Whom `left` is probed against in the second round: the host with the fastest measured
    link (the first in `hosts` among equals, or when nothing was measured)."""
    others = [h for h in hosts if h != left]
    order = {h: i for i, h in enumerate(others)}
    return max(others, key=lambda h: (best.get(h, -1.0), -order[h]))


def usable_hosts(record: FleetRecord) -> list[str]:
    """The hosts a probe can reach (no problem recorded), in the fleet's order."""
    return [h.name for h in record.hosts if not h.problem]


def needs_probe(record: FleetRecord) -> bool:
    """Two usable hosts or more, and one of them without a measured link to another."""
    hosts = usable_hosts(record)
    if len(hosts) < 2:
        return False
    best = _best_among(record.bandwidth, hosts)
    return any(h not in best for h in hosts)


async def probed(
    prober: Prober | None,
    record: FleetRecord,
    entry: ResourceState,
    state: State,
    progress: Callable[[str], None],
    *,
    budget: float = APPLY_PROBE_BUDGET,
) -> FleetRecord:
    """`record` with the links of its unmeasured hosts measured (`apply_pairs`) and merged
    into what it had, when `needs_probe`; else as it is. `entry`: the fleet's state entry as
    apply will commit it (the probe reaches the hosts it lists)."""
    if prober is None or not needs_probe(record):
        return record
    hosts = usable_hosts(record)
    old = record.bandwidth
    best = _best_among(old, hosts)
    plan = apply_pairs(hosts, best)
    fresh = sum(1 for h in hosts if h not in best)
    progress(
        f"measuring the bandwidth of {fresh} host(s): {plan.pairs()} pair(s) at once, "
        f"at most {budget:g}s"
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    bandwidth = old
    tried: list[BandwidthLink] = []
    try:
        got = await _measure(prober, entry, state, plan.first, budget)
        tried += got.links
        bandwidth = got if bandwidth is None else bandwidth.merged(got)
        if plan.left is not None:
            pair = (partner(hosts, _best_among(bandwidth, hosts), plan.left), plan.left)
            remaining = deadline - loop.time()
            if remaining > 0:
                got = await _measure(prober, entry, state, (pair,), remaining)
            else:  # the first round took it all: not worth starting a probe to cancel it
                why = f"not measured within the probe's {budget:g}s budget"
                link = BandwidthLink(src=pair[0], dst=pair[1], error=why)
                got = BandwidthRecord(
                    measured_at=got.measured_at, seconds=got.seconds, links=(link,)
                )
            tried += got.links
            bandwidth = bandwidth.merged(got)
    except DstackPlanError as e:
        progress(f"bandwidth not measured: {e}")
    if bandwidth is None or bandwidth is old:
        return record
    measured = sum(1 for x in tried if x.bytes_per_second is not None)
    progress(f"measured {measured} of {len(tried)} pair(s); the gang choice estimates the rest")
    return record.model_copy(update={"bandwidth": bandwidth})


async def _measure(
    prober: Prober,
    entry: ResourceState,
    state: State,
    pairs: Sequence[Pair],
    budget: float,
) -> BandwidthRecord:
    """`pairs` measured by `prober`, which cancels what is not done within `budget`; a prober
    that does not is given up on a little later, so that no apply waits on it."""
    scope = PairScope(tuple(pairs), budget, APPLY_PARALLELISM)
    try:
        return await asyncio.wait_for(
            prober(entry.name, state.with_resource(entry), scope), budget + BUDGET_GRACE
        )
    except asyncio.TimeoutError:
        raise DstackPlanError(f"no result within {budget + BUDGET_GRACE:g}s") from None


def _best_among(bandwidth: BandwidthRecord | None, hosts: Sequence[str]) -> dict[str, float]:
    """host -> its fastest measured link to another of `hosts` (absent: none)."""
    if bandwidth is None:
        return {}
    kept = bandwidth.among(set(hosts))
    return kept.best_rates() if kept is not None else {}


def entry_for(
    address: str, spec: Mapping[str, Any], record: FleetRecord, clock: Clock
) -> ResourceState:
    """The fleet's entry as it will be committed: what the probe reads the hosts from."""
    return ResourceState.create(
        address,
        provider="ssh",
        spec=spec,
        status=record.status,
        now=timestamp(clock),
        attributes=record.to_attributes(),
    )
