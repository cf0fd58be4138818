"""Does a machine satisfy a run's `resources:`? Pure functions, no I/O.

Machines in a fleet are shared by the jobs placed on them, so a requirement is met when the
machine can provide its lower bound; upper bounds only matter when choosing cloud offers.
"""

from __future__ import annotations

from dstack_plan.config.gpu import GPUSpec
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import GPU, MachineResources


def static_mismatch(requirements: ResourcesSpec, machine: MachineResources) -> str | None:
    """Why `machine` could never take such a job, even with nothing else running on it."""
    cpu = requirements.cpu
    if cpu.arch is not None and cpu.arch.value != machine.cpu_arch:
        return f"needs {cpu.arch.value} CPUs, machine is {machine.cpu_arch}"
    if (cpu.count.min or 0) > machine.cpus:
        return f"needs {cpu.count.min} CPUs, machine has {machine.cpus}"
    if (requirements.memory.min or 0) > machine.memory_gb:
        return f"needs {requirements.memory} memory, machine has {machine.memory_gb:g}GB"
    disk = requirements.disk.size
    if (disk.min or 0) > machine.disk_gb:
        return f"needs {disk} disk, machine has {machine.disk_gb:g}GB"
    wanted = gpus_wanted(requirements.gpu)
    if wanted == 0:
        return None
    suitable = [g for g in machine.gpus if _gpu_matches(requirements.gpu, g)]
    if len(suitable) < wanted:
        if suitable:
            has = f"has {len(suitable)} suitable"
        elif machine.gpus:
            has = f"has none (it has {len(machine.gpus)} {machine.gpus[0].name})"
        else:
            has = "has none"
        return f"needs {describe_gpus(requirements.gpu, wanted)}, {has}"
    return None


def describe_gpus(spec: GPUSpec, count: int) -> str:
    """`8 GPUs H100 80GB`, `1 GPU`: what a job asks for, in words."""
    what = [",".join(spec.name)] if spec.name else []
    if not what and spec.vendor is not None:
        what.append(spec.vendor.value)
    if spec.memory is not None:
        what.append(str(spec.memory))
    return " ".join([f"{count} GPU{_s(count)}", *what])


def gpus_wanted(gpu: GPUSpec) -> int:
    """How many GPUs a job takes: the lower bound of the count range."""
    return gpu.count.min or 0


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def _gpu_matches(spec: GPUSpec, gpu: GPU) -> bool:
    if spec.vendor is not None and spec.vendor.value != gpu.vendor.lower():
        return False
    if spec.name and not any(_same_gpu(name, gpu.name) for name in spec.name):
        return False
    if spec.memory is not None and gpu.memory_mib:
        return spec.memory.contains(gpu.memory_mib / 1024)
    return True


def _same_gpu(wanted: str, actual: str) -> bool:
    # nvidia-smi says "NVIDIA A100-SXM4-80GB"; configs say "A100"
    simple = actual.upper().replace("NVIDIA", "").replace("AMD", "").replace("INSTINCT", "")
    tokens = simple.replace("-", " ").split()
    return wanted.upper() in tokens or simple.strip().startswith(wanted.upper())
