"""What each namespace (and each user in it) holds and has used today, read from state.

Quota usage lives in the run records (`runs/records.py`): the namespace and user a run
was applied with, and per job the GPUs it holds and when it started and ended (the agent's
times, kept by each refresh). Nothing else keeps it, so destroying a run forgets what it
used today: a known limit (see docs/quotas.md). A job that never started, or a record older
than quotas (no times), used no GPU-hours; a job without a recorded GPU count holds none.

Pure over the state: the caller refreshes it (or not) and gives the time.
"""

from __future__ import annotations

from collections.abc import Collection

from dstack_plan.config.gpu import GPUSpec
from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.matching import gpu_share_wanted, gpus_wanted
from dstack_plan.runs.jobs import job_demands, slots
from dstack_plan.runs.records import RunRecord
from dstack_plan.scheduler.quotas import Usage, UsageKey
from dstack_plan.sharing.imports import SEPARATOR
from dstack_plan.state.model import ResourceState, State

DAY = 86_400.0
HOUR = 3_600.0


def job_gpus(gpu: GPUSpec) -> float:
    """The GPUs a job with this `gpu:` holds, a shared GPU as its fraction (`0.25`)."""
    return gpus_wanted(gpu) * gpu_share_wanted(gpu) / WHOLE


def slot_gpus(spec: RunSpec, replicas: int | None = None) -> dict[tuple[int, int], float]:
    """(replica, node) -> the GPUs that job of the run holds (`replicas`: a service's count,
    default its configured one)."""
    wanted = slots(spec, replicas)
    demands = job_demands(spec, replicas)
    pairs = zip(wanted, demands, strict=True)
    return {(s.replica, s.node): job_gpus(d.resources.gpu) for s, d in pairs}


def run_gpus(spec: RunSpec) -> float:
    """The GPUs all the run's jobs hold (replicas x nodes x each job's)."""
    return sum(slot_gpus(spec).values())


def day_start(now: float) -> float:
    """Midnight UTC of the day `now` is in (epoch seconds count UTC days)."""
    return now - now % DAY


def namespace_usage(
    state: State, now: float, *, released: Collection[str] = ()
) -> dict[UsageKey, Usage]:
    """Usage per namespace (`(namespace, None)`) and per user in it (`(namespace, user)`):
    GPUs held now by unfinished jobs, GPU-hours used since midnight UTC (each job's GPUs
    times its running time within [midnight, now]), and the hourly price of runs with an
    unfinished job. The runs in `released` (those a plan replaces or deletes) hold nothing
    and cost nothing, but what they used today counts. Keys with no usage are left out."""
    found: dict[UsageKey, Usage] = {}
    for run in state.resources.values():
        if run.kind not in RUN_KINDS:
            continue
        record = RunRecord.of(run)
        used = _usage(run, record, now, run.address not in released)
        if used == Usage():
            continue
        keys: list[UsageKey] = [(record.namespace, None)]
        if record.user is not None:
            keys.append((record.namespace, record.user))
        for key in keys:
            before = found.get(key, Usage())
            found[key] = Usage(*(a + b for a, b in zip(before, used, strict=True)))
    return {key: found[key] for key in sorted(found, key=_order)}


def usage_on(state: State, now: float, owner: str, *, released: Collection[str] = ()) -> Usage:
    """What the runs on project `owner`'s fleets (`owner/fleet`) hold now and used today,
    all namespaces and users together (what the owner's limits for this project count),
    counted as `namespace_usage` counts."""
    prefix = owner + SEPARATOR
    total = Usage()
    for run in state.resources.values():
        if run.kind not in RUN_KINDS:
            continue
        record = RunRecord.of(run)
        if record.fleet.startswith(prefix):
            used = _usage(run, record, now, run.address not in released)
            total = Usage(*(a + b for a, b in zip(total, used, strict=True)))
    return total


def run_usage(run: ResourceState, now: float, *, holding: bool = True) -> Usage:
    """What one run holds now and used today (see `namespace_usage`); with `holding` False,
    only what it used."""
    return _usage(run, RunRecord.of(run), now, holding)


def _usage(run: ResourceState, record: RunRecord, now: float, holding: bool) -> Usage:
    midnight = day_start(now)
    gpus = hours = 0.0
    active = False
    of_spec: dict[tuple[int, int], float] | None = None
    for job in record.jobs:
        finished = job.status in FINISHED_STATUSES
        active = active or not finished
        held = job.gpus
        if held is None:  # a record older than quotas: what its spec asks for
            if of_spec is None:
                of_spec = _spec_gpus(run)
            held = of_spec.get(job.slot, 0.0)
        if holding and not finished:
            gpus += held
        hours += held * _overlap(job.started_at, job.finished_at, finished, midnight, now)
    cost = record.price_per_hour if holding and active else 0.0
    return Usage(gpus, hours, cost)


def _spec_gpus(run: ResourceState) -> dict[tuple[int, int], float]:
    spec = spec_from_normalized(run.kind, run.spec)
    assert isinstance(spec, RunSpec)
    replicas = max((j.replica for j in RunRecord.of(run).jobs), default=0) + 1
    return slot_gpus(spec, replicas if isinstance(spec, ServiceSpec) else None)


def hours_today(started: float | None, ended: float | None, now: float) -> float:
    """Hours of a job's run (`ended` None: it runs on) within the UTC day of `now`, as the
    agent times it: what its GPUs count toward a daily limit."""
    return _overlap(started, ended, ended is not None, day_start(now), now)


def _overlap(
    started: float | None, ended: float | None, finished: bool, midnight: float, now: float
) -> float:
    """Hours of [started, ended or now] within [midnight, now]; 0 when it never started, or
    ended without a recorded end (an older record: nothing to count from)."""
    if started is None or (finished and ended is None):
        return 0.0
    end = now if ended is None else min(ended, now)
    return max(0.0, end - max(started, midnight)) / HOUR


def _order(key: UsageKey) -> tuple[str, str]:
    namespace, user = key
    return (namespace, user or "")
