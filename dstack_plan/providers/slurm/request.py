"""Which partition a run goes to, and what it asks Slurm for there (pure).

A run's `resources:` are per node, as everywhere: the lower bound of each range is what it
asks (`--cpus-per-task`, `--mem`, `--gres=gpu:N`), the partition is the first the backend
config lists whose nodes have that much (GPU model by name, as on every fleet) and which has
as many nodes as the run. Disk is not Slurm's to grant: it is not asked.

| config field                  | Slurm request                                          |
|-------------------------------|--------------------------------------------------------|
| `nodes`                       | `--nodes=N --ntasks-per-node=1`                        |
| `resources.cpu` (lower bound) | `--cpus-per-task`                                      |
| `resources.memory` (lower)    | `--mem` (per node, MB)                                 |
| `resources.gpu` count, name   | `--gres=<gres>:<count>` on a partition of that model   |
| `max_duration`                | `--time` (minutes, rounded up)                         |
| `stop_duration`               | `--signal=B:TERM@<s>` before the limit; a stop's grace |
| backend `account`, `qos`      | `--account`, `--qos`                                   |
"""

from __future__ import annotations

from collections.abc import Sequence

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.slurm_backend import SlurmCluster
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.providers.matching import NO_DISK_LIMIT_GB, gpus_wanted, static_mismatch
from dstack_plan.providers.slurm.partitions import Partition
from dstack_plan.providers.slurm.script import SlurmRequest, time_minutes


def node_resources(partition: Partition) -> MachineResources:
    """What one node of `partition` has, as a machine of any fleet."""
    gpu = GPU(vendor=partition.vendor or "nvidia", name=partition.gpu or "")
    return MachineResources(
        cpus=partition.cpus,
        memory_gb=partition.memory_mb / 1024,
        disk_gb=NO_DISK_LIMIT_GB,
        gpus=tuple(gpu for _ in range(partition.gpus)) if partition.gpu else (),
    )


def choose_partition(
    resources: ResourcesSpec, nodes: int, partitions: Sequence[Partition]
) -> Partition | str:
    """The first partition whose nodes meet `resources` with `nodes` usable nodes; else
    why none does, partition by partition."""
    reasons = []
    for partition in partitions:
        why = partition_mismatch(resources, partition, nodes)
        if why is None:
            return partition
        reasons.append(f"{partition.name}: {why}")
    return "; ".join(reasons) or "the backend config names no partitions"


def partition_mismatch(
    resources: ResourcesSpec, partition: Partition, nodes: int = 1
) -> str | None:
    """Why a run of `nodes` nodes asking `resources` per node cannot go to `partition`;
    None when it can. A run without GPUs never takes a GPU partition's nodes."""
    if (gpus_wanted(resources.gpu) > 0) != (partition.gpu is not None):
        if partition.gpu:
            return "a GPU partition: runs without GPUs go to the CPU partitions"
        return "a CPU partition: its nodes have no GPUs"
    why = static_mismatch(resources, node_resources(partition))
    if why is None and partition.usable < nodes:
        why = f"has {partition.usable} usable node(s), the run needs {nodes}"
    return why


def slurm_request(
    resources: ResourcesSpec,
    partition: Partition,
    cluster: SlurmCluster,
    *,
    nodes: int,
    max_duration: float | None,
    stop_seconds: float,
    comment: str | None = None,
) -> SlurmRequest:
    """What a run of `nodes` nodes asks for on `partition` (see the module's table)."""
    gpus = gpus_wanted(resources.gpu)
    memory = resources.memory.min
    return SlurmRequest(
        partition=partition.name,
        nodes=nodes,
        cpus_per_task=resources.cpu.count.min or None,
        mem_mb=int(memory * 1024) if memory else None,
        gres=f"{partition.gres or 'gpu'}:{gpus}" if gpus else None,
        time_minutes=time_minutes(max_duration),
        stop_seconds=int(stop_seconds),
        account=cluster.account,
        qos=cluster.qos,
        comment=comment,
    )
