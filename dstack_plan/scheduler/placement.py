"""Choosing machines for a run's jobs. Pure: the caller gathers candidates, we decide.

A decision is one of three: placed (a machine for every job), pending (the machines could take
the run, but what runs on them now holds the GPUs or ports it needs), or never (not even an
idle machine could: too few GPUs, replicas that bind the same port on a single host...). Each
way, it says why, per candidate.

Among the machines a job fits, it takes the one where it adds the least expected
fragmentation for the jobs likely to come (`packing`: Fragmentation Gradient Descent, then best
fit; ties by host name), so small jobs do not scatter over every host and starve big ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.providers.matching import (
    gpu_share_wanted,
    gpus_needed,
    static_mismatch,
)
from dstack_plan.scheduler.bandwidth import best_gang
from dstack_plan.scheduler.ledger import Held, HostLedger
from dstack_plan.scheduler.occupancy import gpu_free, percent, take
from dstack_plan.scheduler.packing import (
    UNIFORM,
    WHOLE,
    HostState,
    Scorer,
    Shape,
    Workload,
    choice_key,
)

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
    gpu_share: int = WHOLE
    """How much of each of its GPUs it holds, in thousandths (below 1000: a shared GPU)."""
    gpu_indices: tuple[int, ...] = ()
    """Which GPUs, when known (a running job); a job being placed gets them by the agent's
    rule (`occupancy`)."""


class JobDemand(NamedTuple):
    """One job of a run, to be placed."""

    label: str
    """`replica 1`, `node 0`, `job`: how messages name it."""
    resources: ResourcesSpec
    ports: tuple[int, ...] = ()
    """Ports the job binds on the machine itself (a process, or a container on the host
    network); a bridged container's ports are mapped to free host ports and never clash."""


def held_by(demand: JobDemand, owner: str, host_gpus: Sequence[GPU] = ()) -> HostJob:
    """What a job of `demand` holds of the machine (with `host_gpus`) it is placed on."""
    gpu = demand.resources.gpu
    return HostJob(owner, gpus_needed(gpu, host_gpus), demand.ports, gpu_share_wanted(gpu))


class Candidate(NamedTuple):
    """A machine a run may use, and what holds part of it now."""

    fleet: str
    provider: str
    host: str
    resources: MachineResources
    busy: tuple[HostJob, ...] = ()
    price_per_hour: float = 0.0
    ledger: HostLedger | None = None
    """What holds the machine, tallied (`scheduler/ledger.py`): when given, it stands for
    `busy` (a caller placing many runs keeps one ledger per machine up to date instead of
    listing every job for every run)."""

    @property
    def label(self) -> str:
        return f"{self.fleet} ({self.host})"

    def tallied(self) -> HostLedger:
        """What holds the machine: its ledger, else one built from `busy`."""
        return self.ledger if self.ledger is not None else HostLedger(self.busy)

    def idle(self) -> Candidate:
        """The machine with nothing on it."""
        return self._replace(busy=(), ledger=None)


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
    demands: Sequence[JobDemand],
    candidates: Sequence[Candidate],
    distinct: bool,
    workload: Workload | None = None,
    bandwidth: Mapping[tuple[str, str], float] | None = None,
) -> Decision:
    """Pick a machine for each job: the fragmentation-aware best (see the module docstring).

    `distinct`: multi-node jobs each need their own machine (a gang: all or none); replicas
    may share one. `workload`: the jobs likely to come (None: those on the candidates and
    these ones, or `packing.UNIFORM` when none of them uses GPUs). `bandwidth`: measured
    links ((src, dst) -> bytes/s); with it a gang of alike nodes takes, among the hosts that
    can take a node, the best-linked set (`bandwidth.best_gang`, packing order on ties).
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
    ledgers = [c.tallied() for c in candidates]
    scorer = Scorer(workload or _observed(demands, ledgers))
    now = _best_fit(demands, candidates, ledgers, distinct, scorer, bandwidth)
    if not isinstance(now, _Miss):
        return Decision(hosts=now)
    # what runs there only takes capacity away, so idle machines are asked only on a miss
    idle = [c.idle() for c in candidates]
    empty = _best_fit(demands, idle, [HostLedger() for _ in idle], distinct, scorer)
    if isinstance(empty, _Miss):
        return Decision(
            reason=_never_reason(empty, len(demands) > 1),
            blocked_by=frozenset(w.kind for _, w in empty.why),
        )
    return Decision(
        reason=_pending_reason(now, len(demands) > 1),
        pending=True,
        blocked_by=frozenset(w.kind for _, w in now.why if w.waits),
    )


def _observed(demands: Sequence[JobDemand], ledgers: Sequence[HostLedger]) -> Workload:
    """The mix of GPU demands (count and share) among the jobs on the machines and those
    being placed."""
    counts: Counter[Shape] = Counter()
    for ledger in ledgers:  # their tallies: not a step per job on the machines
        counts.update(ledger.shapes())
    counts.update(_shape(d) for d in demands)
    if not any(shape.gpus for shape in counts):
        return UNIFORM
    return Workload.from_counts(counts)


def _shape(job: JobDemand, host_gpus: Sequence[GPU] = ()) -> Shape:
    gpu = job.resources.gpu
    return Shape(gpus=gpus_needed(gpu, host_gpus), gpu_milli=gpu_share_wanted(gpu))


class _Load(NamedTuple):
    """What holds a candidate while a run's jobs are placed: its ledger, and the jobs of the
    run placed on it so far (after the ledger's, in order)."""

    ledger: HostLedger
    placed: tuple[HostJob, ...] = ()

    def gpu_free(self, count: int) -> list[int]:
        if not self.placed:
            return self.ledger.gpu_free(count)
        return gpu_free(count, [*self.ledger.gpu_holders(), *self.placed])

    def gpu_holders(self) -> list[Held]:
        return [*self.ledger.gpu_holders(), *(j for j in self.placed if j.gpus)]

    def port_owner(self, port: int) -> str | None:
        owner = self.ledger.port_owner(port)
        if owner is None:
            owner = next((j.owner for j in self.placed if port in j.ports), None)
        return owner


def _state(candidate: Candidate, load: _Load) -> HostState:
    """What is free on the machine for packing: GPUs only (CPU and memory are checked
    against the machine's size, not accounted per job yet)."""
    gpus = candidate.resources.gpus
    model = gpus[0].name if gpus else ""
    return HostState(model, 0, 0, tuple(sorted(load.gpu_free(len(gpus)), reverse=True)))


def _best_fit(
    demands: Sequence[JobDemand],
    candidates: Sequence[Candidate],
    ledgers: Sequence[HostLedger],
    distinct: bool,
    scorer: Scorer,
    bandwidth: Mapping[tuple[str, str], float] | None = None,
) -> tuple[Candidate, ...] | _Miss:
    load = {i: _Load(ledger) for i, ledger in enumerate(ledgers)}
    alike = all(d[1:] == demands[0][1:] for d in demands)  # all but the label
    if distinct and bandwidth and len(demands) > 1 and alike:
        # a gang of alike nodes: any feasible host takes any node, so pick the set by links
        ranked, _ = _ranked(demands[0], candidates, load, set(), scorer)
        names = [candidates[i].host for i in ranked]
        gang = best_gang(names, len(demands), bandwidth)
        if gang is not None:
            by_name = {candidates[i].host: i for i in ranked}
            return tuple(candidates[by_name[h]] for h in gang.hosts)
    chosen: list[int] = []
    for job in demands:
        ranked, misses = _ranked(job, candidates, load, set(chosen) if distinct else set(), scorer)
        if not ranked:
            return _Miss(job, tuple(misses))
        index = ranked[0]
        chosen.append(index)
        held = held_by(job, job.label, candidates[index].resources.gpus)
        load[index] = load[index]._replace(placed=(*load[index].placed, held))
    return tuple(candidates[i] for i in chosen)


def _ranked(
    job: JobDemand,
    candidates: Sequence[Candidate],
    load: dict[int, _Load],
    taken: set[int],
    scorer: Scorer,
) -> tuple[list[int], list[tuple[Candidate, _Why]]]:
    """The candidates (by index, best first) that can take `job` now, and why the others
    cannot."""
    states = {i: _state(c, load[i]) for i, c in enumerate(candidates)}
    free: dict[str, int] = {}
    for state in states.values():
        free[state.model] = free.get(state.model, 0) + sum(state.gpus)
    pressure = scorer.pressure(free)
    misses: list[tuple[Candidate, _Why]] = []
    keyed = []
    for i, candidate in enumerate(candidates):
        if i in taken:
            continue
        why = _why_not(job, candidate, load[i])
        if why is not None:
            misses.append((candidate, why))
            continue
        move = scorer.move(states[i], _shape(job, candidate.resources.gpus))
        if move is not None:  # None cannot happen when the checks above pass; be safe
            keyed.append((choice_key(move, pressure.get(states[i].model, 0.0), candidate.host), i))
    return [i for _, i in sorted(keyed)], misses


def _why_not(job: JobDemand, candidate: Candidate, load: _Load) -> _Why | None:
    static = static_mismatch(job.resources, candidate.resources)
    if static is not None:
        return _Why(static, RESOURCES)
    gpu_why = _gpu_shortfall(job, candidate, load)
    if gpu_why is not None:
        return gpu_why
    for port in job.ports:
        holder = load.port_owner(port)
        if holder is not None:
            return _Why(
                f"port {port} is already used on {candidate.host} by {holder}",
                PORTS,
                f"waits for port {port} on {candidate.fleet} ({candidate.host}), used by {holder}",
            )
    return None


def _gpu_shortfall(job: JobDemand, candidate: Candidate, load: _Load) -> _Why | None:
    """Why the GPUs the job needs are not free on the machine now; None when they are."""
    wanted = gpus_needed(job.resources.gpu, candidate.resources.gpus)
    if not wanted:
        return None
    share = gpu_share_wanted(job.resources.gpu)
    free = load.gpu_free(len(candidate.resources.gpus))
    if take(free, wanted, share) is not None:
        return None
    holders = ", ".join(dict.fromkeys(j.owner for j in load.gpu_holders()))
    if share < WHOLE:
        most = max(free, default=0)
        return _Why(
            f"needs {percent(share)} of a GPU, the most free is {percent(most)} "
            f"(shared with {holders})",
            GPUS,
            f"waits for {percent(share)} of a GPU on {candidate.fleet}, busy with {holders}",
        )
    idle = sum(1 for f in free if f >= WHOLE)
    plural = "s" if wanted > 1 else ""
    return _Why(
        f"needs {wanted} free GPU{plural}, {idle} free (busy with {holders})",
        GPUS,
        f"waits for {wanted} GPU{plural} on {candidate.fleet}, busy with {holders}",
    )


def _never_reason(miss: _Miss, name_job: bool) -> str:
    prefix = f"{miss.job.label}: " if name_job else ""
    return (
        "; ".join(dict.fromkeys(f"{c.label}: {prefix}{why.text}" for c, why in miss.why))
        or "not enough machines"
    )


def _pending_reason(miss: _Miss, name_job: bool) -> str:
    prefix = f"{miss.job.label} " if name_job else ""
    waits = [f"{prefix}{why.waits}" for _, why in miss.why if why.waits]
    if not waits:  # the busy machines led elsewhere; say what each machine lacks
        waits = [f"{c.label}: {prefix}{why.text}" for c, why in miss.why]
    return "; ".join(dict.fromkeys(waits)) or "not enough machines"
