"""GPU tool output parsing and exclusive allocation."""

from __future__ import annotations

import json

import pytest

from dstack_plan.agent.gpualloc import GpuAllocator, GpuUnavailable
from dstack_plan.agent.gpus import parse_amd_smi, parse_nvidia_inventory, parse_rocm_smi


def test_nvidia_inventory() -> None:
    text = (
        "0, NVIDIA H100 80GB HBM3, 81559, GPU-1a2b\n"
        "1, NVIDIA H100 80GB HBM3, 81559, GPU-3c4d\n"
        "\n"
        "garbage line\n"
    )
    assert parse_nvidia_inventory(text) == [
        {
            "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559,
            "index": 0,
            "uuid": "GPU-1a2b",
        },
        {
            "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559,
            "index": 1,
            "uuid": "GPU-3c4d",
        },
    ]


def test_nvidia_name_with_commas_and_missing_memory() -> None:
    [gpu] = parse_nvidia_inventory("3, Odd, Name, [N/A], GPU-x\n")
    assert (gpu["name"], gpu["memory_mib"], gpu["index"]) == ("Odd, Name", 0, 3)


def test_amd_smi() -> None:
    static = json.dumps(
        [
            {
                "gpu": 0,
                "asic": {"market_name": "AMD Instinct MI300X"},
                "vram": {"size": {"value": 196592, "unit": "MB"}},
            },
            {"gpu": 1, "asic": {"market_name": "AMD Instinct MI300X"}, "vram": {"size": "192 GB"}},
        ]
    )
    listed = json.dumps([{"gpu": 0, "uuid": "u0"}, {"gpu": 1, "uuid": "u1"}])
    gpus = parse_amd_smi(static, listed)
    assert [(g["index"], g["memory_mib"], g["uuid"]) for g in gpus] == [
        (0, 196592, "u0"),
        (1, 192 * 1024, "u1"),
    ]
    assert all(g["vendor"] == "amd" and g["name"] == "AMD Instinct MI300X" for g in gpus)


def test_rocm_smi() -> None:
    text = json.dumps(
        {
            "card1": {
                "Card Series": "MI210",
                "VRAM Total Memory (B)": "68702699520",
                "Unique ID": "0xabc",
            },
            "card0": {
                "Card Series": "MI210",
                "VRAM Total Memory (B)": "68702699520",
                "Unique ID": "0xdef",
            },
            "system": {},
        }
    )
    gpus = parse_rocm_smi(text)
    assert [(g["index"], g["uuid"], g["memory_mib"]) for g in gpus] == [
        (0, "0xdef", 65520),
        (1, "0xabc", 65520),
    ]


def test_allocation_is_exclusive_and_freed() -> None:
    alloc = GpuAllocator([0, 1, 2, 3])
    assert alloc.allocate("a", 2) == [0, 1]
    assert alloc.allocate("b", (3,)) == [3]
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("c", 2)
    assert e.value.status == 409
    assert "asked for 2 GPUs but only 1 is free (free indices: [2]" in str(e.value)
    assert "0 by job a" in str(e.value)
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("c", (3,))
    assert e.value.status == 409 and "[3] are in use" in str(e.value)
    alloc.release("a")
    assert alloc.free() == [0, 1, 2]
    assert alloc.allocate("c", 3) == [0, 1, 2]


def test_requests_the_host_can_never_meet() -> None:
    alloc = GpuAllocator([])
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("x", 4)
    assert e.value.status == 422 and "asked for 4 GPUs but this host has 0" in str(e.value)
    with pytest.raises(GpuUnavailable) as e:
        GpuAllocator([0, 1]).allocate("x", (5,))
    assert e.value.status == 422 and "indices [5]" in str(e.value)
    assert GpuAllocator([]).allocate("x", 0) == []


def test_claim_restores_allocations_after_restart() -> None:
    alloc = GpuAllocator([0, 1])
    alloc.claim("old", [1])
    assert alloc.allocate("new", 1) == [0]
    assert alloc.allocations() == {0: "new", 1: "old"}
