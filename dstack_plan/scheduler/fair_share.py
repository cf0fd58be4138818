"""Fair share of one fleet's GPUs between tenants, with borrowing and reclaim. Pure.

Each tenant (a project) is guaranteed some of the fleet's GPUs and may borrow idle ones
beyond, up to an optional limit; a tenant under its guarantee takes borrowed GPUs back by
preemption. Kueue's cohorts (`nominalQuota`, `borrowingLimit`, `reclaimWithinCohort: Any`),
on GPUs and hosts:

- `admit`: within its guarantee a job is admitted whenever the GPUs are free; beyond it, it
  borrows: only within the borrowing limit and while no other tenant under its guarantee
  waits for what it would take (that tenant would reclaim it at once: no preemption loop).
- `reclaim`: the victims for one pending job of a tenant under its guarantee, on the one
  host where it then fits: jobs of tenants above their guarantee, newest first, never taking
  one below its guarantee, as few as possible (ties: the most served tenant's first). Never
  for borrowing: a job that would take its own tenant over its guarantee reclaims nothing.
  Stopping the victims (SIGTERM, `stop_duration`, kill) is the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.scheduler.packing import HostState, Shape, fits

EPSILON = 1e-9
"""Shares are fractions (0.1 + 0.2 > 0.3 in floats): sums within this much count as equal."""


@dataclass(frozen=True)
class Tenant:
    """A tenant of the fleet: GPUs it is guaranteed, and how many it may borrow beyond them
    (None: any number that is idle)."""

    name: str
    guarantee_gpus: float
    borrowing_limit: float | None = None

    @classmethod
    def of(
        cls, name: str, guarantee: str | float, capacity: float, limit: str | float | None = None
    ) -> Tenant:
        """Guarantee and borrowing limit as GPU counts or percentages of `capacity`
        (`"50%"`): `resolve_gpus`."""
        borrowing = None if limit is None else resolve_gpus(limit, capacity)
        return cls(name, resolve_gpus(guarantee, capacity), borrowing)


def resolve_gpus(value: str | float, capacity: float) -> float:
    """GPUs from a count (`12`, `"12"`, `0.5`) or a percentage of `capacity` (`"50%"`).

    Raises ValueError (which pydantic validators report as a validation error) for anything
    else, or a negative amount."""
    text = str(value).strip()
    try:
        gpus = float(text[:-1]) * capacity / 100 if text.endswith("%") else float(text)
    except ValueError:
        gpus = -1.0
    if not 0 <= gpus < float("inf"):  # NaN too
        raise ValueError(f"expected a GPU count >= 0 or a percentage such as 50%, got {value!r}")
    return gpus


@dataclass(frozen=True)
class Held:
    """A job that holds GPUs (or part of a host) now."""

    job: str
    tenant: str
    host: str
    gpus: float
    """GPUs it holds, a share of one as its fraction."""
    started_at: float
    """When it started (any clock, the same for all): the newest go first."""
    preemptible: bool = True
    shape: Shape | None = None
    """What it takes of its host (CPU, memory, GPUs); None: `gpus` alone."""
    gpu_indices: tuple[int, ...] = ()
    """Which GPUs of its host (positions in the host's GPUs); empty: not known."""

    def taken(self) -> Shape:
        """What it takes of its host: `shape`, else whole GPUs or a share of one."""
        if self.shape is not None:
            return self.shape
        if self.gpus < 1:
            return Shape(gpus=1 if self.gpus > EPSILON else 0, gpu_milli=round(self.gpus * WHOLE))
        return Shape(gpus=round(self.gpus))


@dataclass(frozen=True)
class Admission:
    ok: bool
    borrowing: bool
    """The job takes its tenant beyond its guarantee."""
    why: str


def gpu_amount(shape: Shape) -> float:
    """GPUs a job of `shape` holds (a share of one as its fraction)."""
    return shape.gpus * min(shape.gpu_milli, WHOLE) / WHOLE


def usage(held: Iterable[Held]) -> dict[str, float]:
    """GPUs each tenant holds."""
    used: dict[str, float] = {}
    for h in held:
        used[h.tenant] = used.get(h.tenant, 0.0) + h.gpus
    return used


def admit(
    tenant: str,
    gpus: float,
    tenants: Sequence[Tenant],
    held: Iterable[Held],
    capacity: float,
    pending_under_guarantee: Mapping[str, float],
) -> Admission:
    """May `tenant` start a job of `gpus` GPUs now?

    `held`: what runs (only `tenant` and `gpus` are read: one entry per tenant with its
    total will do). `capacity`: the fleet's GPUs. `pending_under_guarantee`: per tenant, the
    GPUs of its pending jobs that the free GPUs do not serve and that would take back what
    this job borrows (a host-aware caller counts the jobs that would fit where this one goes
    once the borrowed jobs there left; a caller without hosts, every queued GPU). A tenant
    absent from `tenants` has no guarantee and no borrowing limit.
    """
    guarantee = {t.name: t.guarantee_gpus for t in tenants}
    used = usage(held)
    free = capacity - sum(used.values())
    if gpus > free + EPSILON:
        return Admission(False, False, f"needs {_n(gpus)} GPUs, {_n(max(free, 0.0))} free")
    after, mine = used.get(tenant, 0.0) + gpus, guarantee.get(tenant, 0.0)
    if after <= mine + EPSILON:
        return Admission(True, False, f"within guarantee ({_n(after)} of {_n(mine)})")
    limit = next((t.borrowing_limit for t in tenants if t.name == tenant), None)
    if limit is not None and after - mine > limit + EPSILON:
        why = f"would borrow {_n(after - mine)} GPUs, borrowing limit {_n(limit)}"
        return Admission(False, True, why)
    for other, waiting in sorted(pending_under_guarantee.items()):
        short = guarantee.get(other, 0.0) - used.get(other, 0.0)
        if other != tenant and short > EPSILON and waiting > EPSILON:
            why = f"{other} is {_n(short)} GPUs under its guarantee and waits for "
            return Admission(False, True, why + f"{_n(min(waiting, short))} of them")
    return Admission(True, True, f"borrows {_n(after - mine)} idle GPUs")


def freed(free: HostState, leaving: Iterable[Held]) -> HostState:
    """What is free on a host once `leaving` left: `free` lists the host's free GPUs by
    index (the positions `Held.gpu_indices` name); the result is sorted, as packing wants.

    A job that does not name its GPUs gives back to the least free GPUs that can take
    its part back."""
    gpus = list(free.gpus)
    cpu, memory = free.cpu, free.memory
    for job in leaving:
        shape = job.taken()
        cpu, memory, part = cpu + shape.cpu, memory + shape.memory, min(shape.gpu_milli, WHOLE)
        indices = list(job.gpu_indices)
        if not indices and shape.gpus:
            room = sorted((f, i) for i, f in enumerate(gpus) if f + part <= WHOLE)
            indices = [i for _, i in room[: shape.gpus]]
        for i in indices:
            if 0 <= i < len(gpus):
                gpus[i] = min(gpus[i] + part, WHOLE)
    return HostState(free.model, cpu, memory, tuple(sorted(gpus, reverse=True)))


def reclaim(
    tenant: str,
    job: Shape,
    tenants: Sequence[Tenant],
    held: Sequence[Held],
    hosts: Mapping[str, HostState],
    used: Mapping[str, float] | None = None,
) -> list[Held]:
    """The jobs to preempt so that `tenant`'s pending `job` starts; empty when it should not
    or cannot (see the module docstring for the rules).

    `hosts`: what is free on each host the job may go to, GPUs by index (`freed`). `held`:
    the jobs that could be victims, with their hosts (others are ignored). `used`: GPUs each
    tenant holds, when `held` lists only some jobs (default: summed from `held`). Jobs that
    are already stopping should be left out of both. On each host the victims are taken
    newest first; among hosts, the fewest victims win, then those of the tenant most served
    relative to its guarantee (held / guarantee: newest first alone would always hit the
    tenant that borrowed last, the least served one), then the newest, then the host name.
    """
    used = usage(held) if used is None else used
    guarantee = {t.name: t.guarantee_gpus for t in tenants}
    own, mine = used.get(tenant, 0.0), guarantee.get(tenant, 0.0)
    if own >= mine - EPSILON or own + gpu_amount(job) > mine + EPSILON:
        return []
    over = {name: gpus - guarantee.get(name, 0.0) for name, gpus in used.items()}
    excess = {name: e for name, e in over.items() if name != tenant and e > EPSILON}
    served = {n: used[n] / guarantee[n] if guarantee.get(n) else math.inf for n in excess}
    on_host: dict[str, list[Held]] = {}
    for h in held:
        if h.preemptible and h.tenant in excess and h.host in hosts:
            on_host.setdefault(h.host, []).append(h)
    best: tuple[tuple[int, float, float, str], list[Held]] | None = None
    for host, candidates in on_host.items():
        victims = _victims_on(hosts[host], job, candidates, excess)
        if victims is not None:
            most = max((served[v.tenant] for v in victims), default=0.0)
            key = (len(victims), -most, -sum(v.started_at for v in victims), host)
            if best is None or key < best[0]:
                best = (key, victims)
    return [] if best is None else best[1]


def _victims_on(
    free: HostState, job: Shape, candidates: list[Held], excess: Mapping[str, float]
) -> list[Held] | None:
    """Newest first, the victims on one host after which `job` fits there (None: it never
    does), then without any that the job does not need (the oldest dropped first)."""
    if fits(freed(free, ()), job):
        return []  # it fits as it is: nothing to preempt here (the caller places it)
    if not fits(freed(free, candidates), job):
        return None  # not even once all of them left
    left = dict(excess)
    chosen: list[Held] = []
    for victim in sorted(candidates, key=lambda h: (-h.started_at, h.job)):
        if left[victim.tenant] - victim.gpus < -EPSILON:
            continue  # that would take its tenant below its guarantee
        left[victim.tenant] -= victim.gpus
        chosen.append(victim)
        if fits(freed(free, chosen), job):
            break
    else:
        return None
    for victim in reversed(chosen[:-1]):  # the oldest first: keep the newest victims
        fewer = [v for v in chosen if v is not victim]
        if fits(freed(free, fewer), job):
            chosen = fewer
    return chosen


def _n(value: float) -> str:
    """A GPU amount as people read it: `3`, `2.5`, `0.47`."""
    return f"{round(value, 3):g}"
