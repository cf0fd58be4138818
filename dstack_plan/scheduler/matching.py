"""Does a machine satisfy a run's `resources:`? Pure functions, no I/O.

Machines in a fleet are shared by the jobs placed on them, so a requirement is met when the
machine can provide its lower bound; upper bounds only matter when choosing cloud offers.
"""

from __future__ import annotations

from dstack_plan.config.gpu import GPUSpec
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import GPU, MachineResources


def mismatch(requirements: ResourcesSpec, machine: MachineResources, free_gpus: int) -> str | None:
    """Why `machine` cannot take a job with these requirements, or None when it can."""
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
        return f"needs {wanted} GPU{'s' if wanted > 1 else ''} ({requirements.gpu}), " + (
            f"machine has {len(suitable)} suitable" if machine.gpus else "machine has none"
        )
    if free_gpus < wanted:
        return f"needs {wanted} free GPUs, {free_gpus} free now"
    return None


def gpus_wanted(gpu: GPUSpec) -> int:
    """How many GPUs a job takes: the lower bound of the count range."""
    return gpu.count.min or 0


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
