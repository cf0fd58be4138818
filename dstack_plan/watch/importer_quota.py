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

import asyncio
import logging
from typing import NamedTuple

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.protocol import TERMINATED_BY_SERVER, TERMINATING
from dstack_plan.apply.deployment import deployment_key
from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.config.quotas import ProjectQuota, load_quotas
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.records import run_span_id
from dstack_plan.runs.usage import hours_today
from dstack_plan.scheduler.quotas import Usage, Violation, project_over_daily
from dstack_plan.sharing.importers import ImporterState, importers_of, read_importer
from dstack_plan.state.events import Event, span_id
from dstack_plan.watch.quota import QUOTA_EXCEEDED
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)


class HostJob(NamedTuple):
    """An importer's job on one of the owner's hosts, as its agent reports it."""

    fleet: str
    host: str
    info: JobInfo

    @property
    def gpus(self) -> float:
        share = self.info.gpu_share if self.info.gpu_share is not None else WHOLE
        return len(self.info.gpus) * share / WHOLE


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
            read = await read_importer(importer)
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
            gpus=sum(j.gpus for j in jobs if not j.info.finished),
            gpu_hours_today=sum(
                j.gpus * hours_today(j.info.started_at, j.info.finished_at, tick.now) for j in jobs
            ),
        )
        violation = project_over_daily(project, limits, used)
        if violation is None:
            return []
        running = [j for j in jobs if not j.info.finished and j.info.status.value != TERMINATING]
        stopped = [await _stop(tick, read, j, violation) for j in running if j.gpus > 0]
        return [e for e in stopped if e is not None]


async def _jobs_of(tick: Tick, fleets: list[str], deployment: str) -> list[HostJob]:
    """The jobs of `deployment` on the hosts of `fleets`; a host that does not answer is
    skipped (its jobs are counted at the next tick it answers)."""
    machines = tick.project.machines

    async def listing(fleet: str, host: str) -> list[HostJob]:
        try:
            agent = await machines.agent(fleet, host, tick.state)
            infos = await agent.list_jobs()
        except DstackPlanError as e:
            log.warning("fleet.%s, %s: cannot list its jobs: %s", fleet, host, e)
            return []
        return [HostJob(fleet, host, i) for i in infos if _deployment(i) == deployment]

    hosts = []
    for fleet in fleets:
        try:
            hosts += [(fleet, m.host) for m in await machines.machines(fleet, tick.state)]
        except DstackPlanError as e:
            log.warning("fleet.%s: %s", fleet, e)
    found = await asyncio.gather(*(listing(f, h) for f, h in hosts))
    return [j for jobs in found for j in jobs]


def _deployment(info: JobInfo) -> str | None:
    labels = info.spec.get("labels") if isinstance(info.spec, dict) else None
    value = labels.get("deployment") if isinstance(labels, dict) else None
    return value if isinstance(value, str) else None


async def _stop(tick: Tick, read: ImporterState, job: HostJob, why: Violation) -> Event | None:
    project = read.importer.project
    labels = job.info.spec.get("labels") or {}
    address = str(labels.get("address") or job.info.run_name)
    text = f"{why.text()} (run {address} of project {project})"
    timeout = job.info.spec.get("stop_timeout") or 0.0
    try:
        agent = await tick.project.machines.agent(job.fleet, job.host, tick.state)
        stopped = await agent.stop(
            job.info.id, timeout=float(timeout), reason=TERMINATED_BY_SERVER
        )
    except DstackPlanError as e:
        log.warning("project %s, %s: could not stop %s: %s", project, address, job.info.id, e)
        return None
    log.info("project %s, %s: stopping %s: %s", project, address, job.info.id, text)
    run = read.state.get(address)
    return Event(
        time=tick.now,
        address=address,
        kind="job",
        # the importer's span of the run, so its own events and these join
        span_id=run_span_id(run) if run is not None else span_id(address, job.info.submitted_at),
        old_status=job.info.status.value,
        new_status=stopped.status.value,
        job_id=job.info.id,
        reason=f"{QUOTA_EXCEEDED}: {text}",
        host=job.host,
    )
