"""Bandwidth probes between a fleet's hosts: every pair (`dstack fleet probe`), or only given
pairs at once under a time budget (fleet apply: `fleets/apply_probe.py`).

For each pair the controller asks the second host's agent to listen on its fleet address
(`Machine.address`, what multi-node runs use), the first's to send there for about a second,
and the listener what arrived (`agent/bandwidth.py`): the agents talk to each other directly
over the hosts' network, the controller only over its SSH channels. `probe_fleet` probes each
unordered pair once (links count as symmetric), in rounds where no host is in two probes at
once (they would share its NIC and each measure half), at most `parallelism` probes of a round
at a time. `probe_pairs` probes only the pairs it is given, disjoint, all at once.
A pair that fails is recorded unknown, with why; it never fails the command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from dstack_plan.agent import bandwidth as limits
from dstack_plan.agent.api_models import ProbeMeasure
from dstack_plan.clock import Clock
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.machines import FleetMachines, Machine
from dstack_plan.fleets.records import BandwidthLink, BandwidthRecord, FleetRecord
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.commit import commit_async
from dstack_plan.state.model import State, timestamp

DEFAULT_PARALLELISM = 4
PAIR_TIMEOUT = 60.0
"""Seconds one pair may take in all (connections, listening, sending, the result)."""


def pair_rounds(count: int) -> list[list[tuple[int, int]]]:
    """Every unordered pair of `count` hosts, in rounds of disjoint pairs (the circle method
    of round-robin tournaments: count - 1 rounds, or count when odd); (i, j) with i < j."""
    slots: list[int | None] = list(range(count))
    if count % 2:
        slots.append(None)
    rounds = []
    for _ in range(len(slots) - 1):
        pairs = []
        for k in range(len(slots) // 2):
            a, b = slots[k], slots[len(slots) - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        if pairs:
            rounds.append(sorted(pairs))
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


async def probe_fleet(
    machines: FleetMachines,
    fleet: str,
    state: State,
    clock: Clock,
    *,
    seconds: float = limits.DEFAULT_SECONDS,
    max_bytes: int = limits.DEFAULT_MAX_BYTES,
    parallelism: int = DEFAULT_PARALLELISM,
) -> BandwidthRecord:
    """Probe every pair of `fleet`'s machines (as `state` records them); a link per pair."""
    if not 0 < seconds <= limits.MAX_SECONDS:
        raise DstackPlanError(f"--seconds must be more than 0 and at most {limits.MAX_SECONDS:g}")
    if parallelism < 1:
        raise DstackPlanError("--parallelism must be at least 1")
    found = await machines.machines(fleet, state)
    measured_at = timestamp(clock)
    limit = asyncio.Semaphore(parallelism)

    async def one(src: Machine, dst: Machine) -> BandwidthLink:
        async with limit:
            return await _probe_pair(
                machines, fleet, state, src, dst, seconds, max_bytes, measured_at
            )

    links: list[BandwidthLink] = []
    for pairs in pair_rounds(len(found)):
        links += await asyncio.gather(*(one(found[i], found[j]) for i, j in pairs))
    order = {m.host: k for k, m in enumerate(found)}
    links.sort(key=lambda x: (order[x.src], order[x.dst]))
    return BandwidthRecord(measured_at=measured_at, seconds=seconds, links=tuple(links))


async def probe_pairs(
    machines: FleetMachines,
    fleet: str,
    state: State,
    clock: Clock,
    pairs: Sequence[tuple[str, str]],
    *,
    budget: float,
    seconds: float = limits.DEFAULT_SECONDS,
    max_bytes: int = limits.DEFAULT_MAX_BYTES,
    parallelism: int | None = None,
) -> BandwidthRecord:
    """Probe only `pairs` ((src, dst) host names of `fleet`), all at once (at most
    `parallelism` together; None: no limit): no host may be in two, or two probes would share
    its NIC. A pair not done within `budget` seconds (connections included) is cancelled and
    recorded unknown with why, as is one naming a host the fleet does not have; a link per
    pair, in order."""
    hosts = [h for pair in pairs for h in pair]
    if len(hosts) != len(set(hosts)):
        raise ValueError(f"pairs probed at once must not share a host: {list(pairs)}")
    found = {m.host: m for m in await machines.machines(fleet, state)}
    measured_at = timestamp(clock)
    limit = asyncio.Semaphore(max(parallelism or len(pairs), 1))

    async def one(src: str, dst: str) -> BandwidthLink:
        missing = [h for h in (src, dst) if h not in found]
        if missing:
            why = f"not probed: {missing[0]} is not a host of fleet {fleet!r}"
            return BandwidthLink(src=src, dst=dst, error=why, measured_at=measured_at)
        async with limit:
            return await _probe_pair(
                machines, fleet, state, found[src], found[dst], seconds, max_bytes, measured_at
            )

    tasks = [asyncio.ensure_future(one(src, dst)) for src, dst in pairs]
    try:
        if tasks:
            await asyncio.wait(tasks, timeout=max(budget, 0.0))
    finally:  # past the budget, or this probe itself cancelled: no probe outlives it
        late = [t for t in tasks if not t.done()]
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    links = []
    for (src, dst), task in zip(pairs, tasks, strict=True):
        if task.cancelled():
            why = f"not measured within the probe's {budget:g}s budget"
            links.append(BandwidthLink(src=src, dst=dst, error=why, measured_at=measured_at))
        else:
            links.append(task.result())
    return BandwidthRecord(measured_at=measured_at, seconds=seconds, links=tuple(links))


async def _probe_pair(
    machines: FleetMachines,
    fleet: str,
    state: State,
    src: Machine,
    dst: Machine,
    seconds: float,
    max_bytes: int,
    measured_at: datetime,
) -> BandwidthLink:
    """`src` sends to `dst`; the link, unknown with why when anything fails."""
    unknown = BandwidthLink(src=src.host, dst=dst.host, measured_at=measured_at)
    for machine in (src, dst):
        if not machine.usable:
            why = machine.problem or "its resources are not known yet"
            return unknown.model_copy(update={"error": f"not probed: {machine.host}: {why}"})

    async def measure() -> tuple[ProbeMeasure, ProbeMeasure]:
        receiver = await machines.agent(fleet, dst.host, state)
        sender = await machines.agent(fleet, src.host, state)
        listener = await receiver.probe_listen(dst.address, max_bytes)
        sent = await sender.probe_send(listener, dst.address, seconds, max_bytes)
        got = await receiver.probe_result(listener.id, wait=int(limits.IO_TIMEOUT) + 5)
        return sent, got

    try:
        sent, got = await asyncio.wait_for(measure(), PAIR_TIMEOUT)
    except DstackPlanError as e:
        return unknown.model_copy(update={"error": str(e)})
    except asyncio.TimeoutError:
        why = f"no result within {PAIR_TIMEOUT:g}s"
        return unknown.model_copy(update={"error": why})
    error = got.error
    if got.status != "done" and error is None:
        error = f"the receiver is still {got.status}"
    return BandwidthLink(
        src=src.host,
        dst=dst.host,
        bytes_per_second=got.bytes_per_second if error is None else None,
        sent_bytes_per_second=sent.bytes_per_second,
        bytes=got.bytes,
        seconds=got.seconds,
        error=error,
        measured_at=measured_at,
    )


async def record_bandwidth(
    backend: StateBackend, fleet: str, record: BandwidthRecord, clock: Clock
) -> None:
    """Merge `record` into the fleet's state entry (a compare-and-swap commit of that one
    attribute: hosts and whatever else the entry holds stay as they are). Its pairs take the
    links just measured; pairs it did not probe keep theirs (`BandwidthRecord.merged`)."""
    address = f"fleet.{fleet}"

    def mutate(latest: State) -> State:
        entry = latest.get(address)
        if entry is None or entry.tainted:
            raise DstackPlanError(f"fleet {fleet!r} left the state while it was probed")
        old = FleetRecord.of(entry).bandwidth
        merged = record if old is None else old.merged(record)
        attributes = {**entry.attributes, "bandwidth": merged.model_dump(mode="json")}
        return latest.with_resource(entry.updated(now=timestamp(clock), attributes=attributes))

    await commit_async(backend, mutate)


def link_rows(record: BandwidthRecord) -> list[list[str]]:
    """One row per link: src, dst, the rate (`2.35 GB/s (18.8 Gbit/s)`), or why unknown."""
    rows = []
    for link in record.links:
        rate = link.bytes_per_second
        shown = "unknown" if rate is None else f"{rate / 1e9:.2f} GB/s ({rate * 8e-9:.1f} Gbit/s)"
        rows.append([link.src, link.dst, shown, link.error or ""])
    return rows
