"""Within one project, a waiting run of higher `priority` preempts runs that allow it.

dstack orders its queue by `priority` and never preempts. Here a run may say it can be
preempted (`preemptible: true`, an extension). Each tick, for each queued run of this project
(highest priority first, then oldest) that does not fit its fleet now, this project's
preemptible runs of a lower priority on that fleet give their jobs up: the newest first, only
on the one host where the waiting run then fits, as few as it needs (the rule of
`scheduler/fair_share.reclaim`). Nothing else is ever preempted for a priority: other
projects' jobs, and this project's jobs that are not preemptible or not of a lower priority.

A preempted job is stopped with the reason `preempted` and its run's `stop_duration` as grace;
its run then goes back to `pending` when its `retry` covers `interruption`, else ends
`terminated` (`watch/retries.py`). The waiting run is placed by `watch/pending.py` once the
GPUs are free (it is older in the queue than the run it preempted, so it goes first).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import NamedTuple

from dstack_plan.agent.protocol import PREEMPTED
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.base import MachineResources
from dstack_plan.runs.cohort import cohort, job_shape
from dstack_plan.runs.cohort_gather import fleet_listings
from dstack_plan.runs.queueing import QUEUED_KEY
from dstack_plan.runs.records import RunRecord
from dstack_plan.runs.usage import slot_gpus
from dstack_plan.scheduler.fair_share import Tenant, reclaim
from dstack_plan.state.events import Event
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.job_stops import stop_listed
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)

_MINE = "this project"
_CLAIM = "waiting"
_LOWER = "preemptible"


class _Run(NamedTuple):
    entry: ResourceState
    spec: RunSpec
    fleet: str


class PriorityPreemption:
    """Higher-priority waiting runs take preemptible lower-priority runs' GPUs."""

    name = "priority_preemption"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        runs = _runs(tick.state)
        waiting = [
            r for r in runs if r.entry.status == "pending" and QUEUED_KEY in r.entry.attributes
        ]
        lower = [r for r in runs if r.spec.preemptible and _holds(r.entry)]
        if not waiting or not lower:
            return acted
        taken: set[str] = set()  # jobs preempted this tick: not twice
        waiting.sort(key=lambda r: (-r.spec.priority, r.entry.updated_at))
        for run in waiting:
            victims = [
                r for r in lower if r.fleet == run.fleet and r.spec.priority < run.spec.priority
            ]
            if victims:
                acted.events += await _claim(tick, run, victims, taken)
        return acted


def _runs(state: State) -> list[_Run]:
    found = []
    for entry in state.resources.values():
        if entry.kind not in RUN_KINDS or entry.tainted:
            continue
        spec = spec_from_normalized(entry.kind, entry.spec)
        assert isinstance(spec, RunSpec)
        found.append(_Run(entry, spec, RunRecord.of(entry).fleet))
    return found


def _holds(entry: ResourceState) -> bool:
    """Whether the run has a job that has not ended."""
    return any(j.status not in FINISHED_STATUSES for j in RunRecord.of(entry).jobs)


async def _claim(tick: Tick, run: _Run, lower: list[_Run], taken: set[str]) -> list[Event]:
    """Preempt what `run` needs of `lower`'s jobs on one host of its fleet, if any."""
    largest = max(slot_gpus(run.spec).values(), default=0.0)
    if largest <= 0:
        return []
    machines = tick.project.machines
    try:
        found = await machines.machines(run.fleet, tick.state)
    except DstackPlanError as e:
        log.warning("%s: cannot look for preemptible jobs: %s", run.entry.address, e)
        return []
    hosts: dict[str, MachineResources] = {
        m.host: m.resources for m in found if m.resources is not None
    }
    listings = await fleet_listings(machines, tick.state, run.fleet, list(hosts))
    hosts = {h: r for h, r in hosts.items() if h in listings}
    c = cohort(run.fleet, hosts, listings, {_MINE: (tick.state, run.fleet)}, {})
    ids = {j.id: r for r in lower for j in RunRecord.of(r.entry).jobs}
    held = [
        replace(h, tenant=_LOWER, preemptible=h.job not in taken)
        if h.tenant == _MINE and h.job in ids
        else replace(h, tenant=_MINE, preemptible=False)
        for h in c.held
    ]
    used = {_LOWER: sum(h.gpus for h in held if h.tenant == _LOWER), _CLAIM: 0.0}
    tenants = [Tenant(_CLAIM, float("inf")), Tenant(_LOWER, 0.0)]
    victims = reclaim(_CLAIM, job_shape(largest), tenants, held, c.free, used)
    infos = {i.id: i for jobs in listings.values() for i in jobs}
    events = []
    for victim in victims:
        lower_run = ids[victim.job]
        why = (
            f"preempted: {run.entry.address} (priority {run.spec.priority}) waits for "
            f"{victim.host}; {lower_run.entry.address} (priority {lower_run.spec.priority}) "
            "is preemptible"
        )
        info = infos[victim.job]
        event = await stop_listed(tick, run.fleet, victim.host, info, PREEMPTED, why, tick.state)
        if event is not None:
            taken.add(victim.job)
            events.append(event)
    return events
