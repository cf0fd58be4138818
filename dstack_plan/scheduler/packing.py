"""Fragmentation-aware packing: which feasible host a job should take. Pure.

The score is Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23). The
fragmentation of a host, for one kind of job, is the free GPU capacity (in thousandths of a
GPU) that such a job cannot use there: all of it when the job cannot run on the host at all
(too few CPUs, memory or whole GPUs, another GPU model); for a job that fits, the free parts
of GPUs too small for its share. Weighted by how common each kind of job is (the workload),
that is the host's expected fragmentation; a job goes where placing it increases that least.
Ties, and a workload that gives no signal (no GPU jobs, no GPUs), fall back to best fit: the
host left with the least free GPU capacity, then CPU, then memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from dstack_plan.config.gpu_share import WHOLE


class Shape(NamedTuple):
    """What one job takes of a host."""

    cpu: int = 0
    """Thousandths of a CPU."""
    memory: int = 0
    """MiB."""
    gpus: int = 0
    """How many GPUs."""
    gpu_milli: int = WHOLE
    """How much of each GPU, in thousandths: below 1000 only for one shared GPU."""
    models: frozenset[str] | None = None
    """GPU models it accepts (None: any)."""


class HostState(NamedTuple):
    """What is free on a host. GPUs sorted from most to least free, so equal hosts are
    equal states (a move names GPUs by their position in this order)."""

    model: str
    cpu: int
    memory: int
    gpus: tuple[int, ...]


class Workload(NamedTuple):
    """The jobs likely to come: each kind of job with its share (the shares sum to 1)."""

    classes: tuple[tuple[Shape, float], ...]

    @classmethod
    def from_shapes(cls, shapes: Iterable[Shape]) -> Workload:
        """The mix of `shapes` (each job once), most common first, ties in shape order."""
        return cls.from_counts(Counter(shapes))

    @classmethod
    def from_counts(cls, counts: Mapping[Shape, int]) -> Workload:
        """The mix of jobs of each shape, `counts` of them (`from_shapes`, counted)."""
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].gpus, kv[0].gpu_milli))
        return cls(tuple((shape, n / total) for shape, n in ranked))

    @property
    def has_gpu_jobs(self) -> bool:
        return any(shape.gpus for shape, _ in self.classes)


UNIFORM = Workload.from_shapes(Shape(gpus=n) for n in (1, 2, 4, 8))
"""The default picture when nothing is known: whole-GPU jobs of 1, 2, 4 and 8 GPUs alike."""


class Move(NamedTuple):
    """Placing one job on one host."""

    fragmentation_increase: float
    after: HostState
    taken: tuple[int, ...]
    """Positions (in `HostState.gpus` order before the move) of the GPUs the job takes."""

    def rank(self) -> tuple[float, int, int, int]:
        """Lower is better: least fragmentation added, then best fit."""
        after = self.after
        return (round(self.fragmentation_increase, 9), sum(after.gpus), after.cpu, after.memory)


PRESSURE_STEP = 0.05
"""Model pressures closer than this count as equal (then fragmentation decides)."""


def model_pressure(workload: Workload, free: Mapping[str, int]) -> dict[str, float]:
    """How much of the expected GPU demand only some models can serve leans on each model,
    per unit of its free capacity (1.0: its fair share; 0: no job needs that model in
    particular). `free`: free GPU capacity (thousandths) per model in the cluster.

    FGD alone is blind to this: a job that runs anywhere may take a scarce model's GPUs that
    jobs which run only there need next, and strand them. A job that could run on several
    models goes to the least pressed one first; among hosts of equal pressure, FGD."""
    return _pressure(_tied_demand(workload), free)


def _tied_demand(workload: Workload) -> list[tuple[frozenset[str], float]]:
    """The share of the expected GPU demand tied to each set of models (jobs that run on
    any model press every model alike, so they are left out)."""
    demand = sum(p * s.gpus * min(s.gpu_milli, WHOLE) for s, p in workload.classes)
    tied: dict[frozenset[str], float] = {}
    for shape, p in workload.classes:
        if shape.gpus and shape.models is not None and demand:
            share = p * shape.gpus * min(shape.gpu_milli, WHOLE) / demand
            tied[shape.models] = tied.get(shape.models, 0.0) + share
    return sorted(tied.items(), key=lambda kv: sorted(kv[0]))


def _pressure(
    tied: list[tuple[frozenset[str], float]], free: Mapping[str, int]
) -> dict[str, float]:
    pressure = dict.fromkeys(free, 0.0)
    total_free = sum(free.values())
    for models, share in tied:
        allowed = [m for m in models if m in free]
        supply = sum(free[m] for m in allowed)
        if not supply:
            continue  # nothing is free for them any more: no choice can help them
        for model in allowed:
            pressure[model] += share * total_free / supply
    return pressure


def choice_key(move: Move, pressure: float, host: str) -> tuple[int, float, int, int, int, str]:
    """How `place` and the benchmark rank a feasible host (lower is better): the least
    pressed GPU model (in steps of `PRESSURE_STEP`), then the least fragmentation added,
    then best fit, then the host name."""
    return (round(pressure / PRESSURE_STEP), *move.rank(), host)


def runs_on(host: HostState, shape: Shape) -> bool:
    """Could such a job ever run on a host with this much free (GPU count aside)?"""
    if shape.cpu > host.cpu or shape.memory > host.memory:
        return False
    if shape.gpus and shape.models is not None and host.model not in shape.models:
        return False
    return shape.gpus <= len(host.gpus)


def fits(host: HostState, shape: Shape) -> bool:
    """Does the job fit in what is free on the host now?"""
    if not runs_on(host, shape):
        return False
    if not shape.gpus:
        return True
    if shape.gpu_milli < WHOLE:
        return bool(host.gpus) and host.gpus[0] >= shape.gpu_milli
    return len(host.gpus) >= shape.gpus and host.gpus[shape.gpus - 1] == WHOLE


def stranded(host: HostState, shape: Shape) -> int:
    """Free GPU capacity on the host (thousandths) that a job of `shape` cannot use."""
    free = sum(host.gpus)
    if not free or not shape.gpus:
        return free if free and not runs_on(host, shape) else 0
    if not runs_on(host, shape):
        return free
    if shape.gpu_milli < WHOLE:
        return sum(f for f in host.gpus if f < shape.gpu_milli)
    full = host.gpus.count(WHOLE)
    return free if full < shape.gpus else free - full * WHOLE


class Scorer:
    """Fragmentation under one workload, remembered per host state: clusters repeat the same
    few states, so most scores are a dictionary lookup."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._fragmentation: dict[HostState, float] = {}
        self._moves: dict[tuple[HostState, Shape], Move | None] = {}
        self._tied = _tied_demand(workload)
        self._stranded: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        # kinds of job that differ only in CPU and memory share their GPU arithmetic
        groups: dict[Shape, list[tuple[int, int, float]]] = {}
        for shape, p in workload.classes:
            gpu_part = Shape(0, 0, shape.gpus, shape.gpu_milli, shape.models)
            groups.setdefault(gpu_part, []).append((shape.cpu, shape.memory, p))
        self._groups = [
            (g, sum(p for _, _, p in e), max(c for c, _, _ in e), max(m for _, m, _ in e), e)
            for g, e in groups.items()
        ]

    def pressure(self, free: Mapping[str, int]) -> dict[str, float]:
        """`model_pressure` for this workload (its tied demand worked out once)."""
        return _pressure(self._tied, free)

    def fragmentation(self, host: HostState) -> float:
        """The expected GPU capacity (thousandths) the workload cannot use on the host:
        the sum over kinds of job of their share times `stranded`."""
        known = self._fragmentation.get(host)
        if known is None:
            free = sum(host.gpus)
            known = 0.0
            if free:
                cpu, memory = host.cpu, host.memory
                per_group = self._gpu_part_stranded(host)
                for (_, total, most_cpu, most_memory, entries), lost in zip(
                    self._groups, per_group, strict=True
                ):
                    if most_cpu <= cpu and most_memory <= memory:
                        fit = total  # every job of the group has room (the usual case)
                    else:
                        fit = sum(p for c, m, p in entries if c <= cpu and m <= memory)
                    known += fit * lost + (total - fit) * free
            self._fragmentation[host] = known
        return known

    def _gpu_part_stranded(self, host: HostState) -> list[int]:
        """`stranded` for each group's GPU part: it depends on the GPUs alone, which many
        states that differ in CPU or memory share."""
        key = (host.model, host.gpus)
        known = self._stranded.get(key)
        if known is None:
            full = HostState(host.model, 0, 0, host.gpus)
            known = self._stranded[key] = [stranded(full, g[0]) for g in self._groups]
        return known

    def move(self, host: HostState, shape: Shape) -> Move | None:
        """The best way to place a job of `shape` on the host, or None if it does not fit."""
        key = (host, shape)
        if key in self._moves:
            return self._moves[key]
        best: Move | None = None
        if fits(host, shape):
            before = self.fragmentation(host)
            for taken in _choices(host, shape):
                after = _take(host, shape, taken)
                move = Move(self.fragmentation(after) - before, after, taken)
                if best is None or move.rank() < best.rank():
                    best = move
        self._moves[key] = best
        return best


def _choices(host: HostState, shape: Shape) -> list[tuple[int, ...]]:
    if not shape.gpus:
        return [()]
    if shape.gpu_milli >= WHOLE:
        return [tuple(range(shape.gpus))]  # the fullest-free GPUs, all alike
    seen: set[int] = set()
    options: list[tuple[int, ...]] = []
    for i, free in enumerate(host.gpus):  # one GPU of each distinct free amount that fits
        if free >= shape.gpu_milli and free not in seen:
            seen.add(free)
            options.append((i,))
    return options


def _take(host: HostState, shape: Shape, taken: tuple[int, ...]) -> HostState:
    gpus = list(host.gpus)
    for i in taken:
        gpus[i] -= min(shape.gpu_milli, WHOLE)
    gpus.sort(reverse=True)
    return HostState(host.model, host.cpu - shape.cpu, host.memory - shape.memory, tuple(gpus))
