"""The owner enforces the daily GPU-hours it gives each importer project on its fleets.

`.dstack/quotas.yml`'s `projects:` sets an importer's `gpu_hours_per_day` (among its limits);
the importer's plan refuses a start once it is used up, but only the owner's watch (the lease
holder of the owner's state) can stop what already runs. Each tick, when the owner's state has
exports and its quota file limits an importer's GPU-hours, the importer's state is read (never
written: `sharing/importers.py`) for its deployment key, and the jobs of that key on the hosts
of the fleets exported to it are asked of their agents: their GPUs times their running time
today, by the agents' clocks (an importer whose own watch is not running records none of it).
Over the limit, its GPU jobs there are stopped with `terminated_by_server` and their
`stop_duration` as grace, as the namespace quotas do (`watch/quota.py`); the event names the
project, the limit, the usage and the run.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.protocol import TERMINATED_BY_SERVER, TERMINATING
from dstack_plan.apply.deployment import deployment_key
from dstack_plan.config.quotas import ProjectQuota, load_quotas
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.cohort import job_label, listed_gpus
from dstack_plan.runs.cohort_gather import fleet_listings
from dstack_plan.runs.usage import hours_today
from dstack_plan.scheduler.quotas import Usage, project_over_daily
from dstack_plan.sharing.importers import ImporterState, importers_of, read_importer
from dstack_plan.state.events import Event
from dstack_plan.watch.job_stops import stop_listed
from dstack_plan.watch.quota import QUOTA_EXCEEDED
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)


class ImporterJob(NamedTuple):
    """An importer's job on one of the owner's hosts, as its agent lists it."""

    fleet: str
    host: str
    info: JobInfo


class ImporterQuotaEnforcer:
    """Importers' daily GPU-hours on this project's fleets, as an actor of the owner's loop."""

    name = "importer_quotas"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        if not tick.state.exports:
            return acted
        quotas = load_quotas(tick.project.directory)
        for name, importer in importers_of(tick.state).items():
            limits = quotas.projects.get(name)
            if limits is None or limits.gpu_hours_per_day is None:
                continue
            read = await read_importer(tick.project.imports, importer)
            if isinstance(read, str):
                log.warning("%s", read)
                continue
            acted.events += await self._enforce(tick, read, limits)
        return acted

    async def _enforce(self, tick: Tick, read: ImporterState, limits: ProjectQuota) -> list[Event]:
        project = read.importer.project
        fleets = sorted(
            {f for e in tick.state.exports.values() if e.importer(project) for f in e.fleets}
        )
        jobs = await _jobs_of(tick, fleets, deployment_key(read.state.lineage))
        used = Usage(
            gpus=sum(listed_gpus(j.info) for j in jobs if not j.info.finished),
            gpu_hours_today=sum(
                listed_gpus(j.info) * hours_today(j.info.started_at, j.info.finished_at, tick.now)
                for j in jobs
            ),
        )
        violation = project_over_daily(project, limits, used)
        if violation is None:
            return []
        events = []
        for job in jobs:
            if job.info.finished or job.info.status.value == TERMINATING or not job.info.gpus:
                continue
            address = job_label(job.info, "address") or job.info.run_name
            why = f"{QUOTA_EXCEEDED}: {violation.text()} (run {address} of project {project})"
            info, reason = job.info, TERMINATED_BY_SERVER
            event = await stop_listed(tick, job.fleet, job.host, info, reason, why, read.state)
            if event is not None:
                events.append(event)
        return events


async def _jobs_of(tick: Tick, fleets: list[str], deployment: str) -> list[ImporterJob]:
    """The jobs of `deployment` on the hosts of `fleets` that answer."""
    machines = tick.project.machines
    found: list[ImporterJob] = []
    for fleet in fleets:
        try:
            hosts = [m.host for m in await machines.machines(fleet, tick.state)]
        except DstackPlanError as e:
            log.warning("fleet.%s: %s", fleet, e)
            continue
        for host, infos in (await fleet_listings(machines, tick.state, fleet, hosts)).items():
            found += [
                ImporterJob(fleet, host, i)
                for i in infos
                if job_label(i, "deployment") == deployment
            ]
    return found
