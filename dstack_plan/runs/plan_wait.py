"""What a run the plan finds waiting for room waits for, and when it may start.

For each run its fleet has no room for now (pending), the plan adds an estimated earliest
start (`scheduler/eta.py`): the GPUs the jobs on the fleet's hosts give back when their
`max_duration`s end, after the runs queued ahead of it (those already queued in state for
the fleet, oldest first, then those this plan queues before it) have taken theirs. Unknown
when a job it must wait for has no `max_duration`. A run whose GPUs are free now waits for
something else (a host port): it gets no estimate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.config.runs import RunSpec
from dstack_plan.fleets.host_load import BusyJob
from dstack_plan.plan.model import Placement
from dstack_plan.runs.cohort import pending_on
from dstack_plan.runs.jobs import stop_seconds
from dstack_plan.runs.queueing import ESTIMATE_NOTE, QUEUED_KEY
from dstack_plan.runs.usage import slot_gpus
from dstack_plan.scheduler.eta import Ahead, Freeing, earliest_start
from dstack_plan.scheduler.placement import Candidate
from dstack_plan.state.model import State


def with_estimates(
    placements: Mapping[str, Placement],
    specs: Mapping[str, RunSpec],
    fleet: str,
    candidates: Sequence[Candidate],
    busy: Mapping[str, Sequence[BusyJob]],
    state: State,
    now: float,
) -> dict[str, Placement]:
    """`placements` with an estimated start on each pending one (see the module doc)."""
    free = {c.host: float(len(c.resources.gpus)) for c in candidates}
    freeing: list[Freeing] = []
    for host, jobs in busy.items():
        for job in jobs:
            amount = job.held.gpus * job.held.gpu_share / WHOLE
            if host in free and amount > 0:
                free[host] -= amount
                freeing.append(Freeing(host, amount, job.ends_at))
    ahead = _queued(state, fleet)
    result = dict(placements)
    for address, placement in placements.items():
        if not placement.pending or placement.placed or address not in specs:
            continue
        spec = specs[address]
        need = max(slot_gpus(spec).values(), default=0.0)
        estimate = earliest_start(need, free, freeing, ahead, now)
        ahead.append(Ahead(need, _duration(spec)))
        if need <= 0 or (estimate.at is not None and estimate.at <= now):
            continue  # it waits for something else than GPUs (host ports): not estimated
        when = ESTIMATE_NOTE + (_shown(estimate.at, now) if estimate.at else estimate.why)
        note = f"{placement.note}; {when}" if placement.note else when
        result[address] = placement.model_copy(
            update={"estimated_start": estimate.at, "note": note}
        )
    return result


def _queued(state: State, fleet: str) -> list[Ahead]:
    """The runs queued in state for `fleet`, oldest first."""
    return [
        Ahead(p.largest, _duration(p.spec))
        for p in pending_on(state, fleet)
        if QUEUED_KEY in p.entry.attributes
    ]


def _duration(spec: RunSpec) -> float | None:
    limit = spec.max_duration
    if not isinstance(limit, int | float) or limit <= 0:
        return None
    return float(limit) + stop_seconds(spec)


def _shown(at: float, now: float) -> str:
    """`2026-12-06 10:30 UTC (in 1h5m0s) at the latest, by the max_durations`."""
    from dstack_plan.apply.events import format_duration

    when = datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{when} (in {format_duration(at - now)}) at the latest, by the max_durations"
