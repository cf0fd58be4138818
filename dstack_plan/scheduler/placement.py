"""Choosing machines for a run's jobs. Pure: the caller gathers candidates, we decide.

A decision is one of three: placed (a machine for every job), pending (the machines could take
the run, but what runs on them now holds the GPUs or ports it needs), or never (not even an
idle machine could: too few GPUs, replicas that bind the same port on a single host...). Each
way, it says why, per candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import MachineResources
from dstack_plan.scheduler.matching import gpus_wanted, static_mismatch

GPUS = "gpus"
PORTS = "ports"
RESOURCES = "resources"
MACHINES = "machines"


class HostJob(NamedTuple):
    """Something that holds part of a machine: a job running there, or one being placed."""

    owner: str
    """Who holds it, for messages: `service.web`, `replica 0`."""
    gpus: int = 0
    ports: tuple[int, ...] = ()
    """Ports it binds on the machine itself (host network), not ports Docker maps."""


class JobDemand(NamedTuple):
    """One job of a run, to be placed."""

    label: str
    """`replica 1`, `node 0`, `job`: how messages name it."""
    resources: ResourcesSpec
    ports: tuple[int, ...] = ()
    """Ports the job binds on the machine itself (a process, or a container on the host
    network); a bridged container's ports are mapped to free host ports and never clash."""


class Candidate(NamedTuple):
    """A machine a run may use, and what holds part of it now."""

    fleet: str
    provider: str
    host: str
    resources: MachineResources
    busy: tuple[HostJob, ...] = ()
    price_per_hour: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.fleet} ({self.host})"


class Decision(NamedTuple):
    hosts: tuple[Candidate, ...] = ()
    """One machine per job, in job order; empty when the run cannot be placed."""
    reason: str | None = None
    """Why not: per candidate for a run that can never be placed, what it waits for when
    pending."""
    pending: bool = False
    """Not placed now, but it would be once what holds the machines lets go."""
    blocked_by: frozenset[str] = frozenset()
    """What stood in the way: GPUS, PORTS, RESOURCES (cpu, memory, disk, GPU model), MACHINES."""

    @property
    def placed(self) -> bool:
        return bool(self.hosts)

    @property
    def never(self) -> bool:
        """No machine of the candidates could ever take the run as it is configured."""
        return not self.hosts and not self.pending

    @property
    def price_per_hour(self) -> float:
        return sum({c.host: c.price_per_hour for c in self.hosts}.values())


class _Why(NamedTuple):
    """Why one job does not fit one machine."""

    text: str
    kind: str
    waits: str | None = None
    """For a shortfall of capacity: `waits for 2 GPUs on local, busy with task.other`."""


class _Miss(NamedTuple):
    job: JobDemand
    why: tuple[tuple[Candidate, _Why], ...]


def place(
    demands: Sequence[JobDemand], candidates: Sequence[Candidate], distinct: bool
) -> Decision:
    """Pick a machine for each job, first fit in candidate order.

    `distinct`: multi-node jobs each need their own machine; replicas may share one.
    A run that does not fit is first tried on the same machines idle: if it fits there it is
    pending (with what it waits for), else it never fits (with why, per machine).
    """
    if not candidates:
        return Decision(
            reason="no machines in the eligible fleets", blocked_by=frozenset({MACHINES})
        )
    if distinct and len(demands) > len(candidates):
        return Decision(
            reason=f"needs {len(demands)} machines, eligible fleets have {len(candidates)}",
            blocked_by=frozenset({MACHINES}),
        )
    idle = _first_fit(demands, [c._replace(busy=()) for c in candidates], distinct)
    if isinstance(idle, _Miss):
        return Decision(
            reason=_never_reason(idle, len(demands) > 1),
            blocked_by=frozenset(w.kind for _, w in idle.why),
        )
    now = _first_fit(demands, candidates, distinct)
    if not isinstance(now, _Miss):
        return Decision(hosts=now)
    return Decision(
        reason=_pending_reason(now, len(demands) > 1),
        pending=True,
        blocked_by=frozenset(w.kind for _, w in now.why if w.waits),
    )


def _first_fit(
    demands: Sequence[JobDemand], candidates: Sequence[Candidate], distinct: bool
) -> tuple[Candidate, ...] | _Miss:
    load = {i: list(c.busy) for i, c in enumerate(candidates)}
    chosen: list[int] = []
    for job in demands:
        misses: list[tuple[Candidate, _Why]] = []
        pick = None
        for i, candidate in enumerate(candidates):
            if distinct and i in chosen:
                continue
            why = _why_not(job, candidate, load[i])
            if why is None:
                pick = i
                break
            misses.append((candidate, why))
        if pick is None:
            return _Miss(job, tuple(misses))
        chosen.append(pick)
        load[pick].append(HostJob(job.label, gpus_wanted(job.resources.gpu), job.ports))
    return tuple(candidates[i] for i in chosen)


def _why_not(job: JobDemand, candidate: Candidate, load: list[HostJob]) -> _Why | None:
    static = static_mismatch(job.resources, candidate.resources)
    if static is not None:
        return _Why(static, RESOURCES)
    wanted = gpus_wanted(job.resources.gpu)
    if wanted:
        free = len(candidate.resources.gpus) - sum(j.gpus for j in load)
        if free < wanted:
            holders = ", ".join(dict.fromkeys(j.owner for j in load if j.gpus))
            plural = "s" if wanted > 1 else ""
            return _Why(
                f"needs {wanted} free GPU{plural}, {max(free, 0)} free (busy with {holders})",
                GPUS,
                f"waits for {wanted} GPU{plural} on {candidate.fleet}, busy with {holders}",
            )
    for port in job.ports:
        holder = next((j.owner for j in load if port in j.ports), None)
        if holder is not None:
            return _Why(
                f"port {port} is already used on {candidate.host} by {holder}",
                PORTS,
                f"waits for port {port} on {candidate.fleet} ({candidate.host}), used by {holder}",
            )
    return None


def _never_reason(miss: _Miss, name_job: bool) -> str:
    prefix = f"{miss.job.label}: " if name_job else ""
    return (
        "; ".join(dict.fromkeys(f"{c.label}: {prefix}{why.text}" for c, why in miss.why))
        or "not enough machines"
    )


def _pending_reason(miss: _Miss, name_job: bool) -> str:
    prefix = f"{miss.job.label} " if name_job else ""
    waits = [f"{prefix}{why.waits}" for _, why in miss.why if why.waits]
    if not waits:  # first fit took another path when busy; say what each machine lacks
        waits = [f"{c.label}: {prefix}{why.text}" for c, why in miss.why]
    return "; ".join(dict.fromkeys(waits)) or "not enough machines"
