"""Fleet and run requirements combined: what a job on a fleet with `resources:` may use. Pure.

As dstack combines them: ranges intersect, GPU name lists intersect (a name that refines
another, `A100-80GB` and `A100`, keeps the finer one), vendor and CPU arch must be equal or one
unset, `shm_size` takes the smaller, compute capability the higher minimum. When nothing is
left, the run cannot use the fleet, and `ResourcesConflict` says which part and why.
"""

from __future__ import annotations

from typing import Any, TypeVar

from dstack_plan.config.gpu import GPUSpec
from dstack_plan.config.gpu_names import GPUModel, parse_wanted_name, same_model
from dstack_plan.config.ranges import Range
from dstack_plan.config.resources import CPUSpec, DiskSpec, ResourcesSpec
from dstack_plan.errors import PlanError

R = TypeVar("R", bound=Range[Any])
E = TypeVar("E")


class ResourcesConflict(PlanError):
    """The fleet's and the run's requirements have nothing in common."""


def intersect_resources(fleet: ResourcesSpec, run: ResourcesSpec) -> ResourcesSpec:
    """The requirements both `fleet` and `run` allow; ResourcesConflict when none."""
    gpu_f, gpu_r = fleet.gpu, run.gpu
    gpu = GPUSpec.model_construct(
        vendor=_same("gpu vendor", gpu_f.vendor, gpu_r.vendor),
        name=_names(gpu_f.name, gpu_r.name),
        count=_range("gpu count", gpu_f.count, gpu_r.count),
        memory=_optional_range("gpu memory", gpu_f.memory, gpu_r.memory),
        total_memory=_optional_range("gpu total_memory", gpu_f.total_memory, gpu_r.total_memory),
        compute_capability=max(
            (c for c in (gpu_f.compute_capability, gpu_r.compute_capability) if c is not None),
            default=None,
        ),
    )
    cpu = CPUSpec.model_construct(
        arch=_same("cpu arch", fleet.cpu.arch, run.cpu.arch),
        count=_range("cpu count", fleet.cpu.count, run.cpu.count),
    )
    shm = [s for s in (fleet.shm_size, run.shm_size) if s is not None]
    return ResourcesSpec.model_construct(
        cpu=cpu,
        memory=_range("memory", fleet.memory, run.memory),
        shm_size=min(shm) if shm else None,
        disk=DiskSpec.model_construct(size=_range("disk", fleet.disk.size, run.disk.size)),
        gpu=gpu,
    )


def _range(what: str, fleet: R, run: R) -> R:
    both = fleet.intersect(run)
    if both is None:
        raise ResourcesConflict(f"fleet allows {what} {fleet}, run needs {run}: no overlap")
    return both  # type: ignore[return-value]  # intersect keeps the class


def _optional_range(what: str, fleet: R | None, run: R | None) -> R | None:
    if fleet is None or run is None:
        return fleet if run is None else run
    return _range(what, fleet, run)


def _same(what: str, fleet: E | None, run: E | None) -> E | None:
    if fleet is not None and run is not None and fleet != run:
        raise ResourcesConflict(f"fleet allows {what} {_value(fleet)}, run needs {_value(run)}")
    return fleet if fleet is not None else run


def _value(value: object) -> str:
    return str(getattr(value, "value", value))


def _names(fleet: tuple[str, ...] | None, run: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if not fleet or not run:
        return fleet or run
    kept: list[str] = []
    for a in run:
        for b in fleet:
            finer = _finer(a, b)
            if finer is not None and finer not in kept:
                kept.append(finer)
    if not kept:
        raise ResourcesConflict(
            f"fleet allows GPUs {','.join(fleet)}, run needs {','.join(run)}: none in common"
        )
    return tuple(kept)


def _finer(a: str, b: str) -> str | None:
    """Of two names of one model, the one that says more (`A100-80GB` over `A100`); None
    when they are different GPUs."""
    pa, pb = parse_wanted_name(a), parse_wanted_name(b)
    if not (same_model(pa, pb) and same_model(pb, pa)):
        return None
    if _refines(pa, pb):
        return a
    if _refines(pb, pa):
        return b
    return None


def _refines(fine: GPUModel, coarse: GPUModel) -> bool:
    memory_ok = coarse.memory_gb is None or coarse.memory_gb == fine.memory_gb
    return memory_ok and coarse.forms <= fine.forms
