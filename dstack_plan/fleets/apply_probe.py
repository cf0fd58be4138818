"""Measure a fleet's links when apply provisions it, so gangs placed next take the best pair.

The probe is `dstack fleet probe`'s (`fleets/probe.py`), shortened: every pair of the
fleet's hosts for `APPLY_PROBE_SECONDS`. It runs only when the fleet has two hosts or more
and some pair of them has no measurement yet (a new fleet, or hosts added), and it never
fails an apply: a pair that cannot be measured is recorded unknown with why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from itertools import combinations
from typing import Any

from dstack_plan.clock import Clock
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.records import BandwidthRecord, FleetRecord
from dstack_plan.state.model import ResourceState, State, timestamp

APPLY_PROBE_SECONDS = 0.5
"""Per pair: long enough for TCP to leave slow start on a LAN, short enough for an apply."""

Prober = Callable[[str, State], Awaitable[BandwidthRecord]]
"""(fleet name, a state holding its entry) -> the links measured between its hosts."""


def needs_probe(record: FleetRecord) -> bool:
    """Two usable hosts or more, and a pair of them not measured yet."""
    hosts = [h.name for h in record.hosts if not h.problem]
    if len(hosts) < 2:
        return False
    measured = set(record.bandwidth.matrix()) if record.bandwidth is not None else set()
    return any((a, b) not in measured for a, b in combinations(hosts, 2))


async def probed(
    prober: Prober | None,
    record: FleetRecord,
    entry: ResourceState,
    state: State,
    progress: Callable[[str], None],
) -> FleetRecord:
    """`record` with the fleet's links measured, when `needs_probe`; else as it is. `entry`:
    the fleet's state entry as apply will commit it (the probe reaches the hosts it lists)."""
    if prober is None or not needs_probe(record):
        return record
    progress(f"measuring the bandwidth between {len(record.hosts)} hosts")
    try:
        measured = await prober(entry.name, state.with_resource(entry))
    except DstackPlanError as e:
        progress(f"bandwidth not measured: {e}")
        return record
    return record.model_copy(update={"bandwidth": measured})


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
