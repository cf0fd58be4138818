"""The projects sharing one exported fleet, as fair share sees them (`scheduler/fair_share.py`).

The owner's watch assembles, for each fleet it exports: the tenants (the owner and every
importer of that fleet, each with the guarantee and borrowing limit of the owner's
`.dstack/quotas.yml` `projects:`), what each holds on the fleet's hosts (every unfinished job
the agents list, its tenant told by its deployment key), what is free on each host, and the
runs each tenant has waiting (`pending`) for that fleet in its own state. Pure: the caller
lists the agents and reads the states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.apply.deployment import deployment_key
from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.quotas import ProjectQuota
from dstack_plan.config.runs import RunSpec
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.base import MachineResources
from dstack_plan.runs.records import RunRecord
from dstack_plan.runs.usage import slot_gpus
from dstack_plan.scheduler.fair_share import EPSILON, Held, Tenant, gpu_amount, reclaim, usage
from dstack_plan.scheduler.packing import HostState, Shape
from dstack_plan.state.model import ResourceState, State

UNKNOWN = "(unknown)"
"""The tenant of a job no project of the cohort submitted: it holds GPUs, and is never
preempted."""


class Waiting(NamedTuple):
    """A run of a tenant pending for the fleet: what its largest job needs."""

    tenant: str
    address: str
    job: Shape
    since: float
    """When it went pending (its state entry's last update): the oldest is served first."""


class Cohort(NamedTuple):
    """One fleet's tenants, what they hold and wait for, and what is free per host."""

    fleet: str
    capacity: float
    tenants: tuple[Tenant, ...]
    held: tuple[Held, ...]
    free: dict[str, HostState]
    waiting: tuple[Waiting, ...]

    def used(self) -> dict[str, float]:
        """GPUs each tenant holds."""
        return usage(self.held)


def cohort(
    fleet: str,
    hosts: Mapping[str, MachineResources],
    listings: Mapping[str, Sequence[JobInfo]],
    tenant_states: Mapping[str, tuple[State, str]],
    limits: Mapping[str, ProjectQuota],
) -> Cohort:
    """The cohort of `fleet` (as the owner names it).

    `hosts`: each host's resources; `listings`: each host's jobs (a host missing here did
    not answer: its GPUs count as taken). `tenant_states`: per tenant, its state and how its
    runs name this fleet (`gpu` for the owner, `owner/gpu` for an importer). `limits`: the
    owner's `projects:` entries."""
    capacity = float(sum(len(r.gpus) for r in hosts.values()))
    tenants = tuple(tenant_of(name, limits.get(name), capacity) for name in sorted(tenant_states))
    by_deployment = {_deployment_of(state): name for name, (state, _) in tenant_states.items()}
    held: list[Held] = []
    free: dict[str, HostState] = {}
    for host, resources in hosts.items():
        jobs = listings.get(host)
        gpus = [WHOLE] * len(resources.gpus)
        if jobs is None:
            gpus = [0] * len(resources.gpus)
        for info in jobs or ():
            if info.finished:
                continue
            share = _share(info)
            for index in info.gpus:
                if 0 <= index < len(gpus):
                    gpus[index] = max(0, gpus[index] - share)
            if info.gpus:
                tenant = by_deployment.get(job_label(info, "deployment") or "", UNKNOWN)
                held.append(
                    Held(
                        job=info.id,
                        tenant=tenant,
                        host=host,
                        gpus=listed_gpus(info),
                        started_at=info.started_at or info.submitted_at,
                        preemptible=tenant != UNKNOWN and info.status.value != "terminating",
                        gpu_indices=tuple(info.gpus),
                    )
                )
        model = resources.gpus[0].name if resources.gpus else ""
        free[host] = HostState(model, 1 << 40, 1 << 40, tuple(gpus))
    waiting = [
        w for name, (state, named) in tenant_states.items() for w in _waiting(name, state, named)
    ]
    waiting.sort(key=lambda w: (w.since, w.tenant, w.address))
    return Cohort(fleet, capacity, tenants, tuple(held), free, tuple(waiting))


def job_shape(gpus: float) -> Shape:
    """What a job of `gpus` GPUs takes of a host, as fair share weighs it: whole GPUs, or a
    share of one (CPU and memory left out: GPUs are what is shared)."""
    if gpus < 1:
        return Shape(gpus=1, gpu_milli=round(gpus * WHOLE))
    return Shape(gpus=round(gpus))


def tenant_of(name: str, quota: ProjectQuota | None, capacity: float) -> Tenant:
    """Project `name` as a tenant of a fleet of `capacity` GPUs, by its `projects:` entry
    (none: no guarantee, no borrowing limit)."""
    guarantee = 0.0 if quota is None or quota.guarantee is None else quota.guarantee
    return Tenant.of(name, guarantee, capacity, None if quota is None else quota.borrowing_limit)


def _deployment_of(state: State) -> str:
    return deployment_key(state.lineage)


def listed_gpus(info: JobInfo) -> float:
    """The GPUs a listed job holds, a share of one as its fraction."""
    return len(info.gpus) * _share(info) / WHOLE


def _share(info: JobInfo) -> int:
    return info.gpu_share if info.gpu_share is not None else WHOLE


def job_label(info: JobInfo, key: str) -> str | None:
    """A label of a listed job (`deployment`, `address`): who submitted it, and its run."""
    labels = info.spec.get("labels") if isinstance(info.spec, dict) else None
    value = labels.get(key) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else None


class PendingRun(NamedTuple):
    """A run pending for a fleet, and the GPUs its largest job needs."""

    entry: ResourceState
    spec: RunSpec
    largest: float


def pending_on(state: State, fleet: str) -> list[PendingRun]:
    """The runs of `state` pending for `fleet` (as its runs name it), oldest first."""
    found = []
    for run in state.resources.values():
        if run.kind not in RUN_KINDS or run.status != "pending" or run.tainted:
            continue
        if RunRecord.of(run).fleet != fleet:
            continue
        spec = spec_from_normalized(run.kind, run.spec)
        assert isinstance(spec, RunSpec)
        found.append(PendingRun(run, spec, max(slot_gpus(spec).values(), default=0.0)))
    return sorted(found, key=lambda p: p.entry.updated_at)


def _waiting(tenant: str, state: State, fleet: str) -> list[Waiting]:
    """The tenant's pending runs for `fleet` that need GPUs, each by its largest job."""
    return [
        Waiting(tenant, p.entry.address, job_shape(p.largest), p.entry.updated_at.timestamp())
        for p in pending_on(state, fleet)
        if p.largest > 0
    ]


class Reclaim(NamedTuple):
    """What one tick of the owner's watch does for a fleet: the jobs to preempt, each with
    the waiting run it makes room for, and the GPUs each project under its guarantee waits
    for (published, so that no one borrows them meanwhile)."""

    preempt: tuple[tuple[Held, Waiting], ...]
    waiting: dict[str, float]


def reclaims(c: Cohort) -> Reclaim:
    """Oldest waiting run first: a tenant under its guarantee gets the victims
    `fair_share.reclaim` picks for its run (newest borrowed jobs first, never below another
    tenant's guarantee); a job it took room from counts as placed, for the runs after it."""
    held = list(c.held)
    used = c.used()
    guarantee = {t.name: t.guarantee_gpus for t in c.tenants}
    preempt: list[tuple[Held, Waiting]] = []
    waiting: dict[str, float] = {}
    for run in c.waiting:
        short = guarantee.get(run.tenant, 0.0) - used.get(run.tenant, 0.0)
        amount = gpu_amount(run.job)
        if short <= EPSILON or amount > short + EPSILON:
            continue  # at its guarantee, or the run would borrow: nothing is reclaimed for it
        waiting[run.tenant] = waiting.get(run.tenant, 0.0) + amount
        victims = reclaim(run.tenant, run.job, c.tenants, held, c.free, used)
        if not victims:
            continue
        preempt += [(v, run) for v in victims]
        gone = {v.job for v in victims}
        held = [h for h in held if h.job not in gone]
        for victim in victims:
            used[victim.tenant] -= victim.gpus
        # the run takes the room it was given: the next runs see it held, for good
        held.append(Held(run.address, run.tenant, victims[0].host, amount, float("inf"), False))
        used[run.tenant] = used.get(run.tenant, 0.0) + amount
    return Reclaim(tuple(preempt), waiting)
