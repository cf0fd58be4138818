"""A Kubernetes cluster's nodes as runs see them: groups of alike nodes, what one node has
(pure). The analogue of a Slurm cluster's partitions (`providers/slurm/partitions.py`), read
from the API's nodes (`V1Node`) instead of from the backend config.

- A GPU node is one whose allocatable `nvidia.com/gpu` (vendor nvidia) or `amd.com/gpu`
  (vendor amd) is more than 0. Its group is the value of the backend's `gpu_label` (NVIDIA's
  GPU feature discovery sets `nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB`; an AMD node
  without that label is read by AMD's `amd.com/gpu.product-name`): the nodes a pod selects by
  that label. The model runs name (`A100`) is the label's value reduced by
  `config.gpu_names.normalise_gpu_name` (the value itself when the model is not one it knows).
- A GPU node without such a label is grouped under its vendor (`nvidia`, `amd`) with no model
  (`gpu` None): a run naming a model never goes there (its pod could not select those nodes
  by model), a run asking any GPU (`gpu: 2`, `gpu: amd:1`) can.
- Every other node is in the group `cpu`. MIG slices (`nvidia.com/mig-*`) are not counted.

`nodes` counts a group's nodes; `ready` those whose Ready condition is True and that are not
cordoned (`spec.unschedulable`). What one node has is the allocatable resources (capacity
less what the kubelet keeps) of the group's smallest ready node, field by field (of all its
nodes when none is ready). Taints are not read: a node tainted against pods without the
toleration (a control-plane node) still counts.

A run fits a group when one node of it has what one node of the run asks and the group has as
many ready nodes as the run; where its pods go is the scheduler's to say. The nodes are read
by duck typing (`metadata.labels`, `status.allocatable`, `status.conditions`,
`spec.unschedulable`), so this module imports without the `kubernetes` package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from pydantic import BaseModel, ConfigDict

from dstack_plan.config.gpu_names import normalise_gpu_name
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.providers.matching import NO_DISK_LIMIT_GB, gpus_wanted, static_mismatch

if TYPE_CHECKING:
    import kubernetes

CPU_GROUP = "cpu"
"""The group of the nodes without GPUs."""
GPU_RESOURCES = (("nvidia.com/gpu", "nvidia"), ("amd.com/gpu", "amd"))
"""The extended resources a node's GPUs are allocatable under, with their vendor."""
AMD_PRODUCT_LABEL = "amd.com/gpu.product-name"
"""The label AMD's node labeller names a node's GPU model with."""
_MIB = 1024 * 1024


class NodeGroup(BaseModel):
    """Nodes alike (same GPU label, or no GPUs), with what their smallest one has."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # it is recorded in state

    name: str
    """`cpu`, the GPU label's value (`NVIDIA-A100-SXM4-80GB`), or the vendor of GPU nodes
    without the label (`nvidia`)."""
    nodes: int
    """All its nodes, whatever their state."""
    ready: int
    """Those Ready and schedulable (not cordoned) now."""
    cpus: float
    memory_mib: int
    gpus: int
    """Allocatable GPUs per node."""
    gpu: str | None = None
    """The GPU model as runs name it (`A100`); None: a CPU group, or GPU nodes without the
    label (`vendor` says which)."""
    vendor: str | None = None
    """`nvidia` or `amd` for a GPU group; None for the CPU one."""
    gpu_label: str | None = None
    """The exact label value, for the pod's nodeSelector."""
    gpu_label_key: str | None = None
    """The label `gpu_label` is the value of: the backend's `gpu_label`, or AMD's
    `amd.com/gpu.product-name` when an AMD node lacks that one."""
    gpu_resource: str | None = None
    """What a pod asks its GPUs under (`nvidia.com/gpu`, `amd.com/gpu`); None: a CPU group."""


class _Node(NamedTuple):
    """One node as grouping needs it."""

    ready: bool
    cpus: float
    memory_mib: int
    gpus: int
    vendor: str | None
    resource: str | None
    label_key: str | None
    label: str | None


def parse_quantity(value: str) -> float:
    """A Kubernetes quantity as a number: `500m` is 0.5, `16Gi` 17179869184, `16G` 16e9,
    `1e3` 1000. ValueError for a malformed one. The `kubernetes` package's parser (only
    callers that hold its nodes use this)."""
    try:
        return float(_sdk_parse_quantity()(value))
    except (ValueError, ArithmeticError):
        raise ValueError(f"invalid Kubernetes quantity {value!r}") from None


@cache
def _sdk_parse_quantity() -> Callable[[str], Decimal]:
    # imported when first needed: the package is an optional extra, and slow to import
    from kubernetes.utils.quantity import parse_quantity as parse

    found: Callable[[str], Decimal] = parse
    return found


def node_groups(nodes: Iterable[kubernetes.client.V1Node], gpu_label: str) -> list[NodeGroup]:
    """The cluster's `nodes` grouped as runs see them (see the module doc): GPU groups by
    name, then `cpu`."""
    members: dict[tuple[str | None, str], list[_Node]] = {}
    for node in nodes:
        seen = _read(node, gpu_label)
        name = seen.label or seen.vendor or CPU_GROUP
        members.setdefault((seen.resource, name), []).append(seen)
    groups = [_group(name, listed) for (_, name), listed in members.items()]
    return sorted(groups, key=lambda g: (g.gpu_resource is None, g.name))


def _read(node: kubernetes.client.V1Node, gpu_label: str) -> _Node:
    metadata, status, spec = node.metadata, node.status, node.spec
    labels: Mapping[str, str] = (metadata.labels if metadata is not None else None) or {}
    allocatable: Mapping[str, str] = (status.allocatable if status is not None else None) or {}
    conditions = (status.conditions if status is not None else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    cordoned = bool(spec is not None and spec.unschedulable)
    resource = vendor = None
    gpus = 0
    for name, maker in GPU_RESOURCES:
        count = int(_allocatable(allocatable, name))
        if count > 0:
            resource, vendor, gpus = name, maker, count
            break
    label_key = None
    if vendor is not None:
        keys = (gpu_label, AMD_PRODUCT_LABEL) if vendor == "amd" else (gpu_label,)
        label_key = next((k for k in keys if labels.get(k)), None)
    return _Node(
        ready=ready and not cordoned,
        cpus=_allocatable(allocatable, "cpu"),
        memory_mib=int(_allocatable(allocatable, "memory") // _MIB),
        gpus=gpus,
        vendor=vendor,
        resource=resource,
        label_key=label_key,
        label=labels[label_key] if label_key is not None else None,
    )


def _allocatable(allocatable: Mapping[str, str], name: str) -> float:
    # a value the API should never send counts as none, as a Slurm node's bad number does
    try:
        return parse_quantity(allocatable[name]) if name in allocatable else 0.0
    except ValueError:
        return 0.0


def _group(name: str, listed: list[_Node]) -> NodeGroup:
    ready = [n for n in listed if n.ready]
    shape = ready or listed
    first = listed[0]
    model = normalise_gpu_name(first.label).model if first.label else None
    return NodeGroup(
        name=name,
        nodes=len(listed),
        ready=len(ready),
        cpus=min(n.cpus for n in shape),
        memory_mib=min(n.memory_mib for n in shape),
        gpus=min(n.gpus for n in shape),
        gpu=model or first.label,
        vendor=first.vendor,
        gpu_label=first.label,
        gpu_label_key=first.label_key,
        gpu_resource=first.resource,
    )


def node_resources(group: NodeGroup) -> MachineResources:
    """What one node of `group` has, as a machine of any fleet. Its GPUs are named by the
    label's value, which says more than the model (`NVIDIA-A100-SXM4-80GB`: 80GB, SXM4)."""
    gpu = GPU(vendor=group.vendor or "nvidia", name=group.gpu_label or group.gpu or "")
    return MachineResources(
        cpus=int(group.cpus),  # a fraction of a CPU cannot take a whole one a run asks
        memory_gb=group.memory_mib / 1024,
        disk_gb=NO_DISK_LIMIT_GB,
        gpus=tuple(gpu for _ in range(group.gpus)) if group.gpu_resource else (),
    )


def choose_group(
    resources: ResourcesSpec, nodes: int, groups: Sequence[NodeGroup]
) -> NodeGroup | str:
    """The first group whose nodes meet `resources` with `nodes` ready nodes; else why none
    does, group by group."""
    reasons = []
    for group in groups:
        why = group_mismatch(resources, group, nodes)
        if why is None:
            return group
        reasons.append(f"{group.name}: {why}")
    return "; ".join(reasons) or "the cluster has no nodes"


def group_mismatch(resources: ResourcesSpec, group: NodeGroup, nodes: int = 1) -> str | None:
    """Why a run of `nodes` nodes asking `resources` per node cannot go to `group`; None when
    it can. A run without GPUs never takes a GPU group's nodes."""
    if (gpus_wanted(resources.gpu) > 0) != (group.gpu_resource is not None):
        if group.gpu_resource:
            return "a GPU group: runs without GPUs go to the nodes without GPUs"
        return "its nodes have no GPUs"
    if group.gpu_resource and group.gpu is None and resources.gpu.name:
        return "its nodes lack the GPU label: a run naming a GPU model cannot select them"
    why = static_mismatch(resources, node_resources(group))
    if why is None and group.ready < nodes:
        why = f"has {group.ready} ready node(s), the run needs {nodes}"
    return why


def describe(groups: Sequence[NodeGroup]) -> str:
    """`NVIDIA-A100-SXM4-80GB (2 of 3 nodes ready, 8x A100, 96 CPUs, 1031000 MiB), cpu
    (...)`: for plans and errors."""
    parts = []
    for g in groups:
        gpus = ""
        if g.gpu_resource:
            gpus = f", {g.gpus}x {g.gpu or f'{g.vendor} (model unknown)'}"
        parts.append(
            f"{g.name} ({g.ready} of {g.nodes} nodes ready{gpus}, {g.cpus:g} CPUs, "
            f"{g.memory_mib} MiB)"
        )
    return ", ".join(parts) or "no nodes"
