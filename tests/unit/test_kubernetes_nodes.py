"""A Kubernetes cluster's nodes grouped as runs see them, and which group a run goes to
(`providers/kubernetes/nodes.py`), from the client's own V1Node models."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.kubernetes.nodes import (
    NodeGroup,
    choose_group,
    describe,
    group_mismatch,
    node_groups,
    node_resources,
    parse_quantity,
)

LABEL = "nvidia.com/gpu.product"
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def node(
    name: str,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    gpus: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    ready: str = "True",
    unschedulable: bool | None = None,
) -> Any:
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name, labels={"kubernetes.io/hostname": name, **(labels or {})}
        ),
        status=client.V1NodeStatus(
            allocatable={"cpu": cpu, "memory": memory, "pods": "110", **(gpus or {})},
            conditions=[
                client.V1NodeCondition(type="MemoryPressure", status="False"),
                client.V1NodeCondition(type="Ready", status=ready),
            ],
        ),
        spec=client.V1NodeSpec(unschedulable=unschedulable),
    )


CLUSTER = [
    node("c1", cpu="3920m", memory="15Gi"),
    node("c2", cpu="8", memory="31Gi", ready="False"),
    node("a1", cpu="94", memory="1000Gi", gpus={"nvidia.com/gpu": "8"}, labels={LABEL: A100}),
    node(
        "a2",
        cpu="96",
        memory="1000Gi",
        gpus={"nvidia.com/gpu": "8"},
        labels={LABEL: A100},
        unschedulable=True,
    ),  # fmt: skip
    node("h1", cpu="190", memory="2000Gi", gpus={"nvidia.com/gpu": "8"}, labels={LABEL: H100}),
]


def resources(**fields: Any) -> ResourcesSpec:
    return ResourcesSpec.model_validate(fields)


def by_name(groups: list[NodeGroup]) -> dict[str, NodeGroup]:
    return {g.name: g for g in groups}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", 0.5),
        ("4", 4.0),
        ("16Gi", 16 * 1024**3),
        ("16G", 16e9),
        ("1e3", 1000.0),
        ("128974848", 128974848.0),
        ("129M", 129e6),
        ("123Mi", 128974848.0),
        ("3920m", 3.92),
    ],
)
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


def test_a_malformed_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid Kubernetes quantity '12x'"):
        parse_quantity("12x")


def test_nodes_grouped_by_gpu_label_gpu_groups_first() -> None:
    groups = node_groups(CLUSTER, LABEL)
    assert [g.name for g in groups] == [A100, H100, "cpu"]
    a100, h100, cpu = groups
    assert a100 == NodeGroup(
        name=A100, nodes=2, ready=1, cpus=94, memory_mib=1000 * 1024, gpus=8, gpu="A100",
        vendor="nvidia", gpu_label=A100, gpu_label_key=LABEL, gpu_resource="nvidia.com/gpu",
    )  # fmt: skip
    assert (h100.gpu, h100.ready, h100.cpus) == ("H100", 1, 190)
    # the not-ready node neither counts as ready nor sets the shape
    assert (cpu.nodes, cpu.ready, cpu.cpus, cpu.memory_mib) == (2, 1, 3.92, 15 * 1024)
    assert (cpu.gpu, cpu.vendor, cpu.gpu_resource, cpu.gpus) == (None, None, None, 0)


def test_with_no_ready_node_the_shape_is_of_all() -> None:
    (cpu,) = node_groups(
        [node("x", cpu="4", ready="Unknown"), node("y", cpu="2", ready="False")], LABEL
    )
    assert (cpu.nodes, cpu.ready, cpu.cpus) == (2, 0, 2)


def test_a_node_without_conditions_or_allocatable_is_not_ready_and_empty() -> None:
    bare = client.V1Node(metadata=client.V1ObjectMeta(name="new"), status=client.V1NodeStatus())
    (cpu,) = node_groups([bare], LABEL)
    assert (cpu.name, cpu.nodes, cpu.ready, cpu.cpus, cpu.memory_mib) == ("cpu", 1, 0, 0, 0)


def test_gpu_nodes_without_the_label_are_grouped_by_vendor_with_no_model() -> None:
    nodes = [
        node("n1", gpus={"nvidia.com/gpu": "2"}),
        node(
            "m1",
            gpus={"amd.com/gpu": "8"},
            labels={"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
        ),
        node("m2", gpus={"amd.com/gpu": "4"}),
        node("z", gpus={"nvidia.com/gpu": "0"}, labels={LABEL: A100}),  # no GPU to give
    ]
    groups = by_name(node_groups(nodes, LABEL))
    assert list(groups) == ["AMD_Instinct_MI300X_OAM", "amd", "nvidia", "cpu"]
    mi300 = groups["AMD_Instinct_MI300X_OAM"]
    assert (mi300.gpu, mi300.vendor, mi300.gpu_label_key, mi300.gpu_resource) == (
        "MI300X", "amd", "amd.com/gpu.product-name", "amd.com/gpu",
    )  # fmt: skip
    nvidia = groups["nvidia"]
    assert (nvidia.gpu, nvidia.vendor, nvidia.gpu_label, nvidia.gpus) == (None, "nvidia", None, 2)
    # any GPU may go there, a model never: its pods could not select the nodes by it
    assert group_mismatch(resources(gpu="nvidia:2"), nvidia) is None
    assert group_mismatch(resources(gpu=1), nvidia) is None
    assert "lack the GPU label" in (group_mismatch(resources(gpu="A100:1"), nvidia) or "")
    assert group_mismatch(resources(gpu="MI300X:8"), mi300) is None
    assert groups["cpu"].nodes == 1


def test_node_resources_name_the_gpus_by_the_label() -> None:
    a100 = by_name(node_groups(CLUSTER, LABEL))[A100]
    machine = node_resources(a100)
    assert (machine.cpus, machine.memory_gb, len(machine.gpus)) == (94, 1000, 8)
    assert machine.gpus[0].name == A100 and machine.gpus[0].vendor == "nvidia"
    # the label says 80GB and SXM4: names asking for them match
    assert group_mismatch(resources(gpu="A100-80GB:8"), a100) is None
    assert group_mismatch(resources(gpu="A100-SXM4:1"), a100) is None
    assert group_mismatch(resources(gpu="A100-40GB:1"), a100) is not None
    cpu = node_resources(by_name(node_groups(CLUSTER, LABEL))["cpu"])
    assert (cpu.cpus, cpu.gpus) == (3, ())  # 3.92 CPUs cannot give a run 4


def test_a_run_asking_two_a100s_goes_to_the_a100_group_not_the_h100_one() -> None:
    groups = node_groups(CLUSTER, LABEL)
    chosen = choose_group(resources(gpu="A100:2"), 1, groups)
    assert isinstance(chosen, NodeGroup) and chosen.name == A100
    h100 = by_name(groups)[H100]
    assert group_mismatch(resources(gpu="A100:2"), h100) == (
        f"needs 2 GPUs A100, has none (it has 8 {H100})"
    )
    chosen = choose_group(resources(gpu="H100:8", cpu="100.."), 1, groups)
    assert isinstance(chosen, NodeGroup) and chosen.name == H100


def test_a_run_without_gpus_takes_the_cpu_nodes_only() -> None:
    groups = node_groups(CLUSTER, LABEL)
    chosen = choose_group(resources(cpu="2..", memory="8GB.."), 1, groups)
    assert isinstance(chosen, NodeGroup) and chosen.name == "cpu"
    assert group_mismatch(resources(cpu=2), by_name(groups)[A100]) == (
        "a GPU group: runs without GPUs go to the nodes without GPUs"
    )


def test_no_group_says_why_group_by_group() -> None:
    groups = node_groups(CLUSTER, LABEL)
    why = choose_group(resources(gpu="A100:2"), 2, groups)
    assert why == (
        f"{A100}: has 1 ready node(s), the run needs 2; "
        f"{H100}: needs 2 GPUs A100, has none (it has 8 {H100}); "
        "cpu: its nodes have no GPUs"
    )
    why = choose_group(resources(cpu="4.."), 1, groups)
    assert isinstance(why, str) and "cpu: needs 4 CPUs, machine has 3" in why
    assert choose_group(resources(cpu=1), 1, []) == "the cluster has no nodes"


def test_disk_is_not_matched() -> None:
    groups = node_groups(CLUSTER, LABEL)
    chosen = choose_group(resources(cpu=1, disk="5000GB"), 1, groups)
    assert isinstance(chosen, NodeGroup) and chosen.name == "cpu"


def test_describe() -> None:
    nodes = [*CLUSTER, node("n1", gpus={"nvidia.com/gpu": "2"})]
    text = describe(node_groups(nodes, LABEL))
    assert text.startswith(f"{A100} (1 of 2 nodes ready, 8x A100, 94 CPUs, 1024000 MiB), ")
    assert "nvidia (1 of 1 nodes ready, 2x nvidia (model unknown), 8 CPUs, 32768 MiB)" in text
    assert text.endswith("cpu (1 of 2 nodes ready, 3.92 CPUs, 15360 MiB)")
    assert describe([]) == "no nodes"


def test_a_group_reads_back_from_state() -> None:
    group = node_groups(CLUSTER, LABEL)[0]
    recorded = {**group.model_dump(mode="json"), "added_later": 1}
    assert NodeGroup.model_validate(recorded) == group
