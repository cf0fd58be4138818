"""Stops running jobs that crossed a limit watch enforces (inactivity_duration,
utilization_policy; the decisions are `watch/limits.py`'s).

Each tick, for the runs with such a limit and running jobs, every host they run on is asked
once for its running jobs (side by side, bounded); a job over a limit is stopped with its
reason (`inactivity_duration_exceeded`, `terminated_due_to_utilization_policy`) and the run's
`stop_duration` as the graceful window, which ends it `terminated`: not a failure, so the
retry policy leaves it alone. The next refresh finds its new status.

What this actor remembers lives on it and is lost when watch restarts: the GPU readings of
each host (from the agents' metrics the loop gathered this tick, stamped with the tick's time)
and the last activity seen per job. So a restarted watch starts every utilization window
afresh (it stops a job later than the one before it would have, never earlier); activity is
kept by the agent too (`last_activity_at`), so inactivity survives a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.protocol import RUNNING
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.local import LOCAL_FLEET
from dstack_plan.runs.records import JobRecord, RunRecord, run_span_id
from dstack_plan.state.events import Event
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.limits import Breach, GpuSample, limit_breaches, trim_samples
from dstack_plan.watch.metrics import read_host  # the one parser of the agents' metrics
from dstack_plan.watch.model import HostSeen
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)

MAX_CONCURRENT_HOSTS = 32

HostKey = tuple[str, str]
"""(fleet, host) of a machine."""


def host_key(fleet: str, host: str) -> HostKey:
    """The local fleet has one machine, whatever name older job records give it."""
    return (fleet, "" if fleet == LOCAL_FLEET else host)


@dataclass(frozen=True)
class _Watched:
    """A run with a limit watch enforces, and its running jobs."""

    run: ResourceState
    spec: RunSpec
    fleet: str
    jobs: tuple[JobRecord, ...]


class LimitEnforcer:
    """The limits watch enforces, as an actor of the loop (see the module docstring)."""

    name = "limits"

    def __init__(self) -> None:
        self._samples: dict[HostKey, list[GpuSample]] = {}
        self._activity: dict[str, tuple[float, float]] = {}
        """Job id -> (the agent's `last_activity_at` last seen, the activity time used)."""

    async def act(self, tick: Tick) -> Acted:
        watched = watched_runs(tick.state)
        self._sample(tick.hosts, watched, tick.now)
        running = {j.id for w in watched for j in w.jobs}
        self._activity = {k: v for k, v in self._activity.items() if k in running}
        if not watched:
            return Acted()
        asked = {host_key(w.fleet, j.host): (w.run, j) for w in watched for j in w.jobs}
        infos = await _running_jobs(tick, asked)
        acted = Acted()
        for w in watched:
            for job in w.jobs:
                info = infos.get(host_key(w.fleet, job.host), {}).get(job.id)
                if info is None:
                    continue  # host not answering, or the job ended meanwhile
                breach = self._breach(w, job, info, tick.now)
                if breach is not None:
                    event = await _stop(tick, w, job, info, breach)
                    if event is not None:
                        acted.events.append(event)
        return acted

    def _sample(self, hosts: Iterable[HostSeen], watched: list[_Watched], now: float) -> None:
        """Add this tick's GPU readings of the hosts runs with a utilization_policy use."""
        windows: dict[HostKey, float] = {}
        for w in watched:
            if w.spec.utilization_policy is None:
                continue
            for job in w.jobs:
                key = host_key(w.fleet, job.host)
                windows[key] = max(windows.get(key, 0), w.spec.utilization_policy.time_window)
        kept: dict[HostKey, list[GpuSample]] = {}
        for host in hosts:
            key = host_key(host.fleet, host.host)
            if key not in windows:
                continue
            reading = read_host(host)
            if reading is None:
                # no reading: a window must not span the gap, so it starts again afterwards
                continue
            fresh = [
                GpuSample(now, int(gpu), util)
                for gpu, util in reading.gpu_utilization.items()
                if gpu.isdigit()
            ]
            kept[key] = trim_samples([*self._samples.get(key, []), *fresh], now, windows[key])
        self._samples = kept

    def _breach(self, w: _Watched, job: JobRecord, info: JobInfo, now: float) -> Breach | None:
        """The first limit watch enforces that the job crossed, if any."""
        reported = info.last_activity_at
        before = self._activity.get(info.id)
        if reported is not None:
            if before is None:
                used = reported  # first sight (or a restarted watch): the agent's word
            elif reported > before[0]:
                # new activity since the last tick: counted from no earlier than when this
                # watch saw it, so a host clock behind watch's cannot make it look old
                used = max(reported, before[1], now)
            else:
                used = before[1]
            self._activity[info.id] = (reported, used)
        activity = self._activity.get(info.id)
        breaches = limit_breaches(
            w.spec,
            info,
            now,
            gpu_samples=self._samples.get(host_key(w.fleet, job.host), ()),
            last_activity_at=None if activity is None else activity[1],
        )
        return next((b for b in breaches if b.enforced_by == "watch"), None)


def watched_runs(state: State) -> list[_Watched]:
    """The runs of `state` with a limit watch enforces and at least one running job."""
    found = []
    for run in state.resources.values():
        if run.kind not in RUN_KINDS or run.tainted:
            continue
        record = RunRecord.of(run)
        jobs = tuple(j for j in record.jobs if j.status == RUNNING)
        if not jobs:
            continue
        spec = spec_from_normalized(run.kind, run.spec)
        assert isinstance(spec, RunSpec)
        inactivity = isinstance(spec, DevEnvironmentSpec) and isinstance(
            spec.inactivity_duration, int
        )
        if inactivity or spec.utilization_policy is not None:
            found.append(_Watched(run, spec, record.fleet, jobs))
    return found


async def _running_jobs(
    tick: Tick, hosts: dict[HostKey, tuple[ResourceState, JobRecord]]
) -> dict[HostKey, dict[str, JobInfo]]:
    """Each host (given with a run and a job on it) -> the running jobs its agent reports; a
    host that does not answer is left out (logged), so its jobs are judged again next tick."""
    from dstack_plan.inspect.runs import job_jobs

    limit = asyncio.Semaphore(MAX_CONCURRENT_HOSTS)

    async def one(run: ResourceState, job: JobRecord) -> dict[str, JobInfo] | None:
        async with limit:
            try:
                agent = await job_jobs(tick.project, run, job, tick.state)
                return {i.id: i for i in await agent.list_jobs(status=RUNNING)}
            except DstackPlanError as e:
                log.warning("limits: cannot ask %s for its jobs: %s", job.host, e)
                return None

    keys = sorted(hosts)
    answers = await asyncio.gather(*(one(*hosts[key]) for key in keys))
    return {key: jobs for key, jobs in zip(keys, answers, strict=True) if jobs is not None}


async def _stop(
    tick: Tick, w: _Watched, job: JobRecord, info: JobInfo, breach: Breach
) -> Event | None:
    """Stop `job` for `breach`; the event that says so, or None when the stop failed."""
    from dstack_plan.inspect.runs import job_jobs
    from dstack_plan.inspect.stop import stop_timeout

    address = w.run.address
    span = run_span_id(w.run)
    extra = {
        "event": f"{breach.limit}_exceeded",
        "address": address,
        "job_id": job.id,
        "host": job.host,
        "resource_type": "gpu" if breach.limit == "utilization_policy" else "job",
        "span_id": span,
    }
    try:
        agent = await job_jobs(tick.project, w.run, job, tick.state)
        stopped = await agent.stop(job.id, timeout=stop_timeout(w.run), reason=breach.reason)
    except DstackPlanError as e:
        log.warning("%s: could not stop %s (%s): %s", address, job.id, breach.message, e)
        return None
    log.info("%s: stopping %s: %s", address, job.id, breach.message, extra=extra)
    return Event(
        time=tick.now,
        address=address,
        kind="job",
        span_id=span,
        old_status=info.status.value,
        new_status=stopped.status.value,
        job_id=job.id,
        reason=breach.message,
    )
