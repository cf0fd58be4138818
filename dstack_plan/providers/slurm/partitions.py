"""A cluster's partitions as runs see them: how many nodes, what one node has (pure).

Read from `scontrol show node -o` (one line per node, `Key=Value` words): each node's CPUs,
memory, GPUs (its `gpu` GRES) and state, grouped by the partitions the backend config lets
runs use. A run fits a partition when one node of it has what one node of the run asks, and
the partition has as many nodes as the run; whether it starts now is Slurm's to say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from dstack_plan.config.slurm_backend import SlurmCluster

_WORD = re.compile(r"(?:^|\s)([A-Za-z_]+)=")
_UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "MAINT", "RESERVED", "INVAL")


class Partition(BaseModel):
    """One partition runs may use, with what its smallest node has."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    nodes: int
    """Its nodes, whatever their state."""
    usable: int
    """Those neither down nor drained now."""
    idle: int
    cpus: int
    memory_mb: int
    gpus: int
    gpu: str | None = None
    """The GPU model the backend config says its nodes have; None: a CPU partition."""
    vendor: str | None = None
    gres: str | None = None
    """The GRES a job asks its GPUs under (`gpu`, `gpu:a100`)."""


def parse_nodes(text: str) -> list[dict[str, str]]:
    """The nodes of `scontrol show node -o` output, each as its `Key=Value` words (a value
    runs to the next key, so `Reason=fan failure [root@...]` is kept whole)."""
    nodes = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("NodeName="):
            continue
        keys = list(_WORD.finditer(line))
        fields = {}
        for index, match in enumerate(keys):
            end = keys[index + 1].start() if index + 1 < len(keys) else len(line)
            fields[match.group(1)] = line[match.end() : end].strip()
        nodes.append(fields)
    return nodes


def gres_gpus(gres: str) -> int:
    """The GPUs a node's `Gres=` value counts (`gpu:2`, `gpu:a100:4(S:0-1)`, `gpu:a100:2,
    gpu:h100:2`); 0 for `(null)`."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].strip().split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def partitions_of(cluster: SlurmCluster, nodes: Iterable[dict[str, str]]) -> list[Partition]:
    """The partitions `cluster` lets runs use, as the nodes say (one without nodes: 0)."""
    members: dict[str, list[dict[str, str]]] = {p: [] for p in cluster.partitions}
    for node in nodes:
        for name in node.get("Partitions", "").split(","):
            if name in members:
                members[name].append(node)
    found = []
    for name, listed in members.items():
        gpu = cluster.gpu_of(name)
        states = [n.get("State", "").upper() for n in listed]
        usable = [n for n, s in zip(listed, states, strict=True) if not _down(s)]
        shape = usable or listed
        found.append(
            Partition(
                name=name,
                nodes=len(listed),
                usable=len(usable),
                idle=sum(1 for s in states if s.split("+")[0] == "IDLE"),
                cpus=min((_int(n.get("CPUTot")) for n in shape), default=0),
                memory_mb=min((_int(n.get("RealMemory")) for n in shape), default=0),
                gpus=min((gres_gpus(n.get("Gres", "")) for n in shape), default=0),
                gpu=gpu.gpu if gpu is not None else None,
                vendor=gpu.vendor if gpu is not None else None,
                gres=gpu.gres if gpu is not None else None,
            )
        )
    return found


def _down(state: str) -> bool:
    return any(flag in state for flag in _UNUSABLE)


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def describe(partitions: Sequence[Partition]) -> str:
    """`gpu (2 nodes, 2x A100, 2 CPUs, 2000 MB), cpu (...)`: for plans and errors."""
    parts = []
    for p in partitions:
        gpus = f", {p.gpus}x {p.gpu}" if p.gpu else ""
        parts.append(
            f"{p.name} ({p.usable} of {p.nodes} nodes up{gpus}, {p.cpus} CPUs, {p.memory_mb} MB)"
        )
    return ", ".join(parts) or "no partitions"
