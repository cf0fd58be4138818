"""Matching requirements to machines: real GPU names as nvidia-smi, amd-smi, hl-smi and
providers report them, against every form of the `gpu:` grammar; the other resources; offers
(whole machines) against hosts (shared); fleet and run requirements combined."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.config.gpu_names import marketed_memory_gb, normalise_gpu_name
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.providers.matching import offer_mismatch, static_mismatch
from dstack_plan.scheduler.intersect import ResourcesConflict, intersect_resources

# key -> (vendor, name as its tool or provider reports it, memory MiB as reported)
CATALOGUE: dict[str, tuple[str, str, int]] = {
    "h100-sxm": ("nvidia", "NVIDIA H100 80GB HBM3", 81559),
    "h100-pcie": ("nvidia", "NVIDIA H100 PCIe", 81559),
    "a100-sxm4-80": ("nvidia", "NVIDIA A100-SXM4-80GB", 81920),
    "a100-sxm4-40": ("nvidia", "NVIDIA A100-SXM4-40GB", 40960),
    "a100-pcie-40": ("nvidia", "NVIDIA A100-PCIE-40GB", 40960),
    "a100-pcie-80": ("nvidia", "NVIDIA A100 80GB PCIe", 81920),
    "a10g": ("nvidia", "NVIDIA A10G", 23028),
    "l4": ("nvidia", "NVIDIA L4", 23034),
    "t4": ("nvidia", "Tesla T4", 15360),
    "rtx4090": ("nvidia", "NVIDIA GeForce RTX 4090", 24564),
    "mi300x": ("amd", "AMD Instinct MI300X", 196592),
    "tpu": ("google", "v5litepod-8", 16384),
    "gaudi2": ("intel", "Gaudi2", 98304),
    "gaudi2-hl": ("intel", "HL-225", 98304),
}
NVIDIA = {k for k, (v, _, _) in CATALOGUE.items() if v == "nvidia"}
A100 = {"a100-sxm4-80", "a100-sxm4-40", "a100-pcie-40", "a100-pcie-80"}
H100 = {"h100-sxm", "h100-pcie"}
A100_80 = {"a100-sxm4-80", "a100-pcie-80"}
GB24 = {"a10g", "l4", "rtx4090"}
GAUDI = {"gaudi2", "gaudi2-hl"}


def machine(key: str, count: int = 8, **extra: Any) -> MachineResources:
    vendor, name, mib = CATALOGUE[key]
    gpus = tuple(GPU(vendor=vendor, name=name, memory_mib=mib, index=i) for i in range(count))
    return MachineResources(**{"cpus": 64, "memory_gb": 512, "disk_gb": 1000, **extra}, gpus=gpus)


def spec(gpu: Any = None, **extra: Any) -> ResourcesSpec:
    data = {"cpu": "2..", "memory": "8GB..", "disk": "100GB..", **extra}
    if gpu is not None:
        data["gpu"] = gpu
    return ResourcesSpec.model_validate(data)


@pytest.mark.parametrize(
    ("gpu", "matching"),
    [
        ("A100", A100),
        ("a100", A100),
        ("A100:80GB", A100_80),
        ("A100:80GB:2", A100_80),
        ("80GB:A100:2", A100_80),  # the parts in any order
        ("A100-80GB", A100_80),  # a name that gives memory constrains it
        ("A100-SXM4-80GB", {"a100-sxm4-80"}),  # an exact name is exact
        ("A100-PCIE", {"a100-pcie-40", "a100-pcie-80"}),
        ("A100:40GB..80GB", A100),
        ("H100", H100),
        ("H100:80GB:8", H100),  # 79.6GiB reported is the 80GB it is sold as
        ("H100:80GB:16", set()),
        ("A10G,L4", {"a10g", "l4"}),
        ("L4", {"l4"}),  # not L40S, not T4
        ("T4", {"t4"}),
        ("RTX4090", {"rtx4090"}),
        ("24GB", GB24),  # A10G and L4 report 22.5GiB
        ("24GB..", NVIDIA - {"t4"} | {"mi300x"} | GAUDI),
        ("24GB..40GB", GB24 | {"a100-sxm4-40", "a100-pcie-40"}),
        ("80GB", H100 | A100_80),
        ("2..4", set(CATALOGUE)),
        (2, set(CATALOGUE)),
        ("nvidia", NVIDIA),
        ("nvidia:24GB..:2..4", NVIDIA - {"t4"}),
        ("amd", {"mi300x"}),
        ("amd:MI300X", {"mi300x"}),
        ("MI300X:192GB:8", {"mi300x"}),
        ("tpu", {"tpu"}),
        ("v5litepod-8", {"tpu"}),
        ("tpu-v5litepod-8", {"tpu"}),
        ("Gaudi2", GAUDI),  # hl-smi's HL-225 is a Gaudi2
        ("intel", GAUDI),
        ({"name": ["A100", "H100"], "memory": "40GB.."}, A100 | H100),
        ({"name": ["A100", "H100"], "memory": "80GB.."}, A100_80 | H100),
        ({"total_memory": "160GB..", "count": 2}, H100 | A100_80 | {"mi300x"} | GAUDI),
        ({"compute_capability": 8.0}, H100 | A100 | GB24),
        ({"compute_capability": "8.9"}, H100 | {"l4", "rtx4090"}),
    ],
)
def test_gpu_grammar_against_real_gpu_names(gpu: Any, matching: set[str]) -> None:
    requirements = spec(gpu)
    found = {key for key in CATALOGUE if static_mismatch(requirements, machine(key)) is None}
    assert found == matching


@pytest.mark.parametrize(
    ("name", "model", "memory"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100", 80),
        ("NVIDIA H100 NVL", "H100NVL", None),  # its own model: `H100` does not ask for it
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000Ada", None),
        ("NVIDIA RTX A6000", "RTXA6000", None),
        ("Quadro RTX 6000", "RTX6000", None),
        ("AMD Instinct MI250X/MI250", "MI250X", None),
        ("HL-225", "Gaudi2", None),
        ("v5litepod-8", "v5litepod-8", None),
        ("Some Future GPU", None, None),
    ],
)
def test_tool_names_reduce_to_the_model_configs_use(
    name: str, model: str | None, memory: int | None
) -> None:
    parsed = normalise_gpu_name(name)
    assert (parsed.model, parsed.memory_gb) == (model, memory)


def test_reported_memory_counts_as_the_size_the_model_is_sold_with() -> None:
    assert marketed_memory_gb("A10G", 23028) == 24
    assert marketed_memory_gb("H100", 81559) == 80
    assert marketed_memory_gb("A100", 40960) == 40
    assert marketed_memory_gb("A100", 20000) == 19.5  # far from every size: as reported
    assert marketed_memory_gb(None, 23028) == 22.5


def test_names_the_table_lacks_match_a_word_of_the_tool_name() -> None:
    gpus = (GPU(vendor="nvidia", name="NVIDIA Fake A100"),)
    fake = MachineResources(cpus=8, memory_gb=64, disk_gb=500, gpus=gpus)
    assert static_mismatch(spec("Fake"), fake) is None
    assert static_mismatch(spec("A100"), fake) is None
    assert static_mismatch(spec("Real"), fake) == (
        "needs 1 GPU Real, has none (it has 1 NVIDIA Fake A100)"
    )


@pytest.mark.parametrize(
    ("gpu", "key", "count", "why"),
    [
        ("A100:4", "a100-sxm4-80", 2, "needs 4 GPUs A100, has 2 suitable"),
        ("H100", "l4", 2, "needs 1 GPU H100, has none (it has 2 NVIDIA L4)"),
        ("H100:80GB:8", "l4", 0, "needs 8 GPUs H100 80GB, has none"),
        (
            "A100:80GB",
            "a100-pcie-40",
            8,
            "needs 1 GPU A100 80GB, has none (it has 8 NVIDIA A100-PCIE-40GB, 40GB)",
        ),
        (
            "nvidia:2",
            "mi300x",
            8,
            "needs 2 GPUs nvidia, has none (it has 8 AMD Instinct MI300X, made by amd)",
        ),
        (
            {"compute_capability": "8.0"},
            "t4",
            4,
            "needs 1 GPU, has none (it has 4 Tesla T4, compute capability 7.5)",
        ),
        (
            {"total_memory": "160GB..", "count": 1},
            "a100-sxm4-80",
            2,
            "needs 160GB.. total GPU memory, 1 GPU NVIDIA A100-SXM4-80GB give 80GB",
        ),
    ],
)
def test_a_gpu_mismatch_says_what_and_how_much(gpu: Any, key: str, count: int, why: str) -> None:
    assert static_mismatch(spec(gpu), machine(key, count)) == why


def test_mixed_gpus_are_listed_by_kind() -> None:
    gpus = (GPU(vendor="nvidia", name="Tesla T4"), GPU(vendor="nvidia", name="NVIDIA L4"))
    mixed = MachineResources(cpus=8, memory_gb=64, disk_gb=500, gpus=gpus * 2)
    assert static_mismatch(spec("A10G"), mixed) == (
        "needs 1 GPU A10G, has none (it has 2 Tesla T4, 2 NVIDIA L4)"
    )
    assert static_mismatch(spec("L4:2"), mixed) is None
    assert static_mismatch(spec("L4:3"), mixed) == "needs 3 GPUs L4, has 2 suitable"


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"cpu": 128}, "needs 128 CPUs, machine has 64"),
        ({"cpu": "arm:8"}, "needs arm CPUs, machine is x86"),
        ({"memory": "1TB.."}, "needs 1TB.. memory, machine has 512GB"),
        ({"disk": "2TB.."}, "needs 2TB.. disk, machine has 1000GB"),
        ({"shm_size": "600GB"}, "needs shm_size 600GB, machine has 512GB memory"),
        (
            {"memory": "8GB..16GB", "shm_size": "32GB"},
            "shm_size 32GB is more than the memory it asks for (8GB..16GB)",
        ),
    ],
)
def test_cpu_memory_disk_and_shm_mismatches(extra: dict[str, Any], why: str) -> None:
    assert static_mismatch(spec(**extra), machine("l4", 1)) == why


def test_a_shared_host_gives_the_lower_bounds_an_offer_must_fit_every_range() -> None:
    host = machine("l4", 8)  # 64 CPUs, 512GB
    for requirements in (spec(cpu=8), spec("2..4"), spec(memory="8GB..16GB"), spec(gpu=0)):
        assert static_mismatch(requirements, host) is None
    assert offer_mismatch(spec(cpu=8), host) == "needs 8 CPUs, machine has 64"
    assert offer_mismatch(spec("2..4"), host) == "needs 2..4 GPUs, has 8 suitable"
    assert offer_mismatch(spec("L4:1"), host) == "needs 1 GPU L4, has 8 suitable"
    assert offer_mismatch(spec(memory="8GB..16GB"), host) == (
        "needs 8GB..16GB memory, machine has 512GB"
    )
    assert offer_mismatch(spec(gpu=0), host) == "needs no GPUs, machine has 8"
    assert offer_mismatch(spec("L4:4..8", cpu="32..64"), host) is None
    # disk is what a cloud machine is given, not a fixed part of it: only the lower bound
    assert offer_mismatch(spec("4..8", cpu="64", disk="100GB..200GB"), host) is None


# -- fleet and run requirements combined -------------------------------------------------


def test_ranges_intersect_and_names_keep_the_finer_one() -> None:
    both = intersect_resources(
        spec({"name": ["A100", "H100"], "count": "1..8"}, cpu="2..16", memory="8GB..64GB"),
        spec({"name": ["A100-80GB", "L4"], "count": "4.."}, cpu="8..", memory="32GB.."),
    )
    assert str(both.cpu) == "8..16" and str(both.memory) == "32GB..64GB"
    assert both.gpu.name == ("A100-80GB",) and str(both.gpu.count) == "4..8"
    assert static_mismatch(both, machine("a100-sxm4-80", 8)) is None
    assert static_mismatch(both, machine("a100-sxm4-40", 8)) is not None


def test_shm_takes_the_smaller_and_compute_capability_the_higher() -> None:
    both = intersect_resources(
        spec({"compute_capability": "8.0"}, shm_size="16GB"),
        spec({"compute_capability": "8.9"}, shm_size="4GB"),
    )
    assert both.shm_size == 4 and both.gpu.compute_capability == (8, 9)


@pytest.mark.parametrize(
    ("fleet", "run", "why"),
    [
        (spec(cpu="2..4"), spec(cpu="8.."), "cpu count 2..4, run needs 8..: no overlap"),
        (spec("nvidia"), spec("amd"), "gpu vendor nvidia, run needs amd"),
        (spec(cpu="arm:2.."), spec(cpu="x86:2.."), "cpu arch arm, run needs x86"),
        (spec("A100"), spec("L4"), "GPUs A100, run needs L4: none in common"),
        (spec("A100-40GB"), spec("A100-80GB"), "GPUs A100-40GB, run needs A100-80GB: none in common"),  # noqa: E501
        (spec(memory="..16GB"), spec(memory="32GB.."), "memory ..16GB, run needs 32GB..: no overlap"),  # noqa: E501
    ],
)  # fmt: skip
def test_requirements_with_nothing_in_common_say_which_part(
    fleet: ResourcesSpec, run: ResourcesSpec, why: str
) -> None:
    with pytest.raises(ResourcesConflict) as raised:
        intersect_resources(fleet, run)
    assert str(raised.value) == f"fleet allows {why}"


# -- properties --------------------------------------------------------------------------

GPU_SPECS = st.sampled_from(
    ["A100", "A100:80GB:2", "24GB..", "2..4", "nvidia", "amd:MI300X", "L4:1..2", "0", "8",
     {"total_memory": "80GB..", "count": "1..4"}, {"compute_capability": 8.0}]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    gpu=GPU_SPECS,
    key=st.sampled_from(sorted(CATALOGUE)),
    count=st.integers(0, 8),
    cpus=st.integers(1, 128),
    cpu=st.sampled_from(["1..", "2..8", "16", "4..64"]),
)
def test_a_whole_machine_that_fits_also_fits_as_a_shared_host(
    gpu: Any, key: str, count: int, cpus: int, cpu: str
) -> None:
    requirements, host = spec(gpu, cpu=cpu), machine(key, count, cpus=cpus)
    if offer_mismatch(requirements, host) is None:
        assert static_mismatch(requirements, host) is None


@settings(max_examples=300, deadline=None)
@given(
    fleet=GPU_SPECS,
    run=GPU_SPECS,
    key=st.sampled_from(sorted(CATALOGUE)),
    count=st.integers(0, 8),
)
def test_a_machine_meets_the_intersection_exactly_when_it_meets_both(
    fleet: Any, run: Any, key: str, count: int
) -> None:
    # whole machines: on a shared host a job takes its lowest count, and the intersection's
    # lowest count may be higher (2 GPUs of 40GB meet `total_memory: 80GB..`, 1 does not)
    a, b, host = spec(fleet), spec(run), machine(key, count)
    meets_both = offer_mismatch(a, host) is None and offer_mismatch(b, host) is None
    try:
        both = intersect_resources(a, b)
    except ResourcesConflict:
        assert not meets_both
        return
    assert (offer_mismatch(both, host) is None) == meets_both
