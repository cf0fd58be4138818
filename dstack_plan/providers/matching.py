"""Does a machine satisfy a job's `resources:`? Pure functions, no I/O.

Two ways to ask. A host of a fleet is shared by the jobs placed on it: a job takes the lower
bound of its ranges (cpu, memory, disk, GPU count) and the host must have that much
(`static_mismatch`). An offer is a whole machine the job would get: every range must hold it,
both bounds, so `cpu: 5` takes only 5-CPU machines and `gpu: 2..4` no 8-GPU one
(`offer_mismatch`), as dstack matches offers.

What a GPU is (model, memory, compute capability) is a property of the GPU, so those ranges
hold both ways: `24GB..40GB` never matches an 80GB GPU. Names are OR-lists, case-insensitive,
compared with the model the tool's name reduces to (`config.gpu_names`). Every mismatch says
what and how much: `needs 4 GPUs A100, has 2 suitable`, `needs 8 CPUs, machine has 4`.

It lives with the providers because their `offers(requirements)` filter by it; the scheduler,
above them, makes its placements with the same functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dstack_plan.config.gpu import GPUSpec, GPUVendor
from dstack_plan.config.gpu_names import (
    compute_capability,
    marketed_memory_gb,
    normalise_gpu_name,
    parse_wanted_name,
    same_model,
)
from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.units import format_memory
from dstack_plan.providers.base import GPU, MachineResources

NO_DISK_LIMIT_GB = 1e9
"""The disk of a cluster's node (a Slurm partition's, a Kubernetes node group's) as matching
sees it: not something a job asks the cluster's scheduler for."""


def static_mismatch(requirements: ResourcesSpec, machine: MachineResources) -> str | None:
    """Why a host could never take such a job, even with nothing else running on it (the
    job takes part of it: the lower bounds); None when it could."""
    return mismatch(requirements, machine, whole=False)


def offer_mismatch(requirements: ResourcesSpec, machine: MachineResources) -> str | None:
    """Why a whole machine (an offer) does not satisfy the requirements, every range both
    bounds; None when it does."""
    return mismatch(requirements, machine, whole=True)


def mismatch(requirements: ResourcesSpec, machine: MachineResources, *, whole: bool) -> str | None:
    """The first requirement `machine` fails, in words; None when it meets them all.
    `whole`: the job gets the whole machine (an offer), else part of a shared host."""
    cpu = requirements.cpu
    if cpu.arch is not None and cpu.arch.value != machine.cpu_arch:
        return f"needs {cpu.arch.value} CPUs, machine is {machine.cpu_arch}"
    if whole and not cpu.count.contains(machine.cpus):
        return f"needs {cpu.count} CPUs, machine has {machine.cpus}"
    if (cpu.count.min or 0) > machine.cpus:
        return f"needs {cpu.count.min} CPUs, machine has {machine.cpus}"
    memory = requirements.memory
    if (memory.min or 0) > machine.memory_gb or (whole and not memory.contains(machine.memory_gb)):
        return f"needs {memory} memory, machine has {machine.memory_gb:g}GB"
    shm = requirements.shm_size
    if shm is not None and memory.max is not None and shm > memory.max:
        return f"shm_size {format_memory(shm)} is more than the memory it asks for ({memory})"
    if shm is not None and shm > machine.memory_gb:
        return f"needs shm_size {format_memory(shm)}, machine has {machine.memory_gb:g}GB memory"
    disk = requirements.disk.size
    # Disk is not exact even for an offer: a cloud machine gets the disk it is asked for.
    if (disk.min or 0) > machine.disk_gb:
        return f"needs {disk} disk, machine has {machine.disk_gb:g}GB"
    return _gpu_mismatch(requirements.gpu, machine.gpus, whole)


def gpus_wanted(gpu: GPUSpec) -> int:
    """How many GPUs a job takes on a shared host: the lower bound of the count range."""
    return gpu.count.min or 0


def gpus_needed(gpu: GPUSpec, gpus: Sequence[GPU] = ()) -> int:
    """How many GPUs a job takes on a host with `gpus`: the lower bound of its count, raised
    as far as its count range allows until its GPUs (the suitable ones, lowest index first,
    as the agent hands them out) reach the lower bound of `total_memory`. Without a
    `total_memory`, or when no count in range reaches it (`static_mismatch` says so), the
    lower bound."""
    wanted = gpus_wanted(gpu)
    low = gpu.total_memory.min if gpu.total_memory is not None else None
    if not wanted or not low or not gpus:
        return wanted
    sizes = [gpu_memory_gb(g) for g in gpus if gpu_mismatch(gpu, g) is None]
    if any(size is None for size in sizes):
        return wanted  # a size nobody reported: not known to be too small
    top = min(gpu.count.max or len(sizes), len(sizes))
    for count in range(wanted, top + 1):
        if sum(s for s in sizes[:count] if s is not None) >= low:
            return count
    return wanted


def gpu_share_wanted(gpu: GPUSpec) -> int:
    """How much of each GPU a job takes, in thousandths: its `share` of one GPU, else whole
    GPUs (1000)."""
    return gpu.share if gpu.share is not None else WHOLE


def describe_gpus(spec: GPUSpec, count: int | str) -> str:
    """`8 GPUs H100 80GB`, `1 GPU`, `2..4 GPUs nvidia`: what a job asks for, in words."""
    what = [",".join(spec.name)] if spec.name else []
    if not what and spec.vendor is not None:
        what.append(spec.vendor.value)
    if spec.memory is not None:
        what.append(str(spec.memory))
    plural = "" if str(count) == "1" else "s"
    return " ".join([f"{count} GPU{plural}", *what])


def gpu_mismatch(spec: GPUSpec, gpu: GPU) -> str | None:
    """Why one GPU is not of the kind `spec` asks for (vendor, name, memory, compute
    capability), as a short phrase about the GPU (`40GB`, `made by amd`); None when it is.
    A name alone is its own reason: the empty string."""
    model = normalise_gpu_name(gpu.name)
    vendor = (gpu.vendor or "").lower() or (model.vendor.value if model.vendor else "")
    if spec.vendor is not None and vendor and spec.vendor.value != vendor:
        return f"made by {vendor}"
    memory = gpu_memory_gb(gpu)
    if spec.name and not any(_name_matches(name, gpu, memory) for name in spec.name):
        return ""
    if spec.memory is not None and memory is not None and not spec.memory.contains(memory):
        return f"{memory:g}GB"
    if spec.compute_capability is not None:
        if vendor and vendor != GPUVendor.NVIDIA.value:
            return f"made by {vendor}: compute capability is NVIDIA's"
        known = compute_capability(model.model)
        # unknown: the GPU may well be new enough; refusing it would be a guess too
        if known is not None and known < spec.compute_capability:
            return "compute capability {}.{}".format(*known)
    return None


def gpu_memory_gb(gpu: GPU) -> float | None:
    """The GPU's marketed memory: from what its tool reports, else from its name."""
    model = normalise_gpu_name(gpu.name)
    if gpu.memory_mib:
        return marketed_memory_gb(model.model, gpu.memory_mib)
    return model.memory_gb


def _name_matches(wanted: str, gpu: GPU, memory: float | None) -> bool:
    """`A100` matches any A100; `A100-80GB` only an 80GB one; `A100-SXM4-80GB` only an
    SXM4 one of 80GB: every part the wanted name gives must hold."""
    want, actual = parse_wanted_name(wanted), normalise_gpu_name(gpu.name)
    if not same_model(want, actual):
        return False
    if want.memory_gb is not None and memory != want.memory_gb:
        return False
    return want.forms <= actual.forms


def _gpu_mismatch(spec: GPUSpec, gpus: Sequence[GPU], whole: bool) -> str | None:
    wanted = gpus_wanted(spec) if whole else gpus_needed(spec, gpus)
    if wanted == 0 and not (whole and spec.count.max == 0 and gpus):
        return None
    if wanted == 0:
        return f"needs no GPUs, machine has {len(gpus)}"
    # GPUs of one kind (most hosts have one) are judged once
    kinds: dict[tuple[str, str, int], str | None] = {}
    for g in gpus:
        kind = (g.vendor, g.name, g.memory_mib)
        if kind not in kinds:
            kinds[kind] = gpu_mismatch(spec, g)
    reasons = [kinds[(g.vendor, g.name, g.memory_mib)] for g in gpus]
    suitable = [g for g, why in zip(gpus, reasons, strict=True) if why is None]
    count = str(spec.count) if whole else wanted
    if len(suitable) < wanted or (whole and not spec.count.contains(len(suitable))):
        if suitable:
            has = f"has {len(suitable)} suitable"
        elif gpus:
            has = f"has none (it has {_what_it_has(gpus, reasons)})"
        else:
            has = "has none"
        return f"needs {describe_gpus(spec, count)}, {has}"
    return _total_memory_mismatch(spec, suitable if whole else suitable[:wanted])


def _total_memory_mismatch(spec: GPUSpec, taken: Sequence[GPU]) -> str | None:
    if spec.total_memory is None:
        return None
    sizes = [gpu_memory_gb(g) for g in taken]
    if any(size is None for size in sizes):
        return None  # a size nobody reported: not known to be too small
    total = sum(s for s in sizes if s is not None)
    if spec.total_memory.contains(total):
        return None
    plural = "s" if len(taken) != 1 else ""
    return (
        f"needs {spec.total_memory} total GPU memory, {len(taken)} GPU{plural} "
        f"{taken[0].name} give {total:g}GB"
    )


def _what_it_has(gpus: Sequence[GPU], reasons: Sequence[str | None]) -> str:
    """`2 NVIDIA L4`, `2 NVIDIA A100-PCIE-40GB, 40GB`, `1 NVIDIA T4, 1 NVIDIA L4`."""
    kinds = Counter((g.name, why or "") for g, why in zip(gpus, reasons, strict=True))
    return ", ".join(
        f"{n} {name}" + (f", {why}" if why else "") for (name, why), n in kinds.items()
    )
