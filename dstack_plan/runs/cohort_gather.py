"""Gathering one exported fleet's cohort: the importers' states (read-only) and every host's
job listing, for `runs/cohort.py`. The owner's watch (`watch/fair_share.py`) and its plan
(`runs/plan_placement.py`: which jobs a waiting run would preempt) both gather it this way;
the watch's other rules that ask a fleet's agents use `fleet_listings` too."""

from __future__ import annotations

import asyncio
import logging

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.quotas import Quotas
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.fleets.records import FleetRecord
from dstack_plan.providers.base import MachineResources
from dstack_plan.runs.cohort import Cohort, cohort
from dstack_plan.sharing.importers import importers_of, read_importer
from dstack_plan.sharing.imports import SEPARATOR, Imports
from dstack_plan.state.model import State

log = logging.getLogger(__name__)


async def importer_states(imports: Imports, state: State) -> dict[str, State]:
    """The state of every project the owner's exports name (read once through `imports`);
    one that cannot be read is logged and left out."""
    found: dict[str, State] = {}
    for name, importer in importers_of(state).items():
        read = await read_importer(imports, importer)
        if isinstance(read, str):
            log.warning("%s", read)
        else:
            found[name] = read.state
    return found


async def gather_cohort(
    machines: FleetMachines,
    owner: str,
    state: State,
    fleet: str,
    quotas: Quotas,
    importers: dict[str, State],
) -> tuple[Cohort, dict[str, JobInfo]] | None:
    """The cohort of the owner's exported `fleet`, and every listed job by id; None when the
    state has no such fleet."""
    entry = state.get(f"fleet.{fleet}")
    if entry is None:
        return None
    hosts: dict[str, MachineResources] = {
        h.name: h.resources for h in FleetRecord.of(entry).hosts if h.resources is not None
    }
    named = {i.project for e in state.exports.values() if fleet in e.fleets for i in e.importers}
    tenants = {owner: (state, fleet)}
    tenants |= {n: (s, f"{owner}{SEPARATOR}{fleet}") for n, s in importers.items() if n in named}
    listings = await fleet_listings(machines, state, fleet, list(hosts))
    infos = {i.id: i for jobs in listings.values() for i in jobs}
    return cohort(fleet, hosts, listings, tenants, quotas.projects), infos


async def fleet_listings(
    machines: FleetMachines, state: State, fleet: str, hosts: list[str]
) -> dict[str, list[JobInfo]]:
    """Each answering host's jobs, all projects' (one that does not answer is logged and
    left out: its jobs count at the next tick it answers)."""

    async def one(host: str) -> tuple[str, list[JobInfo] | None]:
        try:
            agent = await machines.agent(fleet, host, state)
            return host, await agent.list_jobs()
        except DstackPlanError as e:
            log.warning("fleet.%s, %s: cannot list its jobs: %s", fleet, host, e)
            return host, None

    found = await asyncio.gather(*(one(h) for h in hosts))
    return {host: jobs for host, jobs in found if jobs is not None}
