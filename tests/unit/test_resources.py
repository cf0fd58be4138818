"""The `resources:` spec: cpu, memory, shm_size, disk and the `gpu:` shorthand; canonical
print, serialisation round trips, error messages and the published JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import ruamel.yaml
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from dstack_plan.config.gpu import GPUSpec, GPUVendor, gpu_vendor_of, infer_gpu_vendor
from dstack_plan.config.ranges import CountRange, MemoryRange
from dstack_plan.config.resources import CPUArch, CPUSpec, DiskSpec, ResourcesSpec

NVIDIA, AMD, GOOGLE, TT = GPUVendor.NVIDIA, GPUVendor.AMD, GPUVendor.GOOGLE, GPUVendor.TENSTORRENT


def value_error(model: type[BaseModel], value: object) -> str:
    """Validate `value`, expecting a ValidationError; return the first message."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(value)
    return str(caught.value.errors()[0]["msg"])


def count(text: str) -> CountRange:
    return CountRange.model_validate(text)


def memory(text: str) -> MemoryRange:
    return MemoryRange.model_validate(text)


# --- GPU ------------------------------------------------------------------------------------

# given -> (vendor, names, memory, count, canonical print)
GPU_FORMS: list[tuple[object, tuple[Any, Any, Any, str, str]]] = [
    ("A100:80GB:2", (NVIDIA, ("A100",), "80GB", "2", "A100:80GB:2")),
    ("A100:40GB:2", (NVIDIA, ("A100",), "40GB", "2", "A100:40GB:2")),
    ("2:80GB:A100", (NVIDIA, ("A100",), "80GB", "2", "A100:80GB:2")),
    ("24GB..:1..8", (None, None, "24GB..", "1..8", "24GB..:1..8")),
    ("1..8:24GB..", (None, None, "24GB..", "1..8", "24GB..:1..8")),
    ("24GB..:2", (None, None, "24GB..", "2", "24GB..:2")),
    ("nvidia:4", (NVIDIA, None, None, "4", "nvidia:4")),
    ("NVIDIA:4", (NVIDIA, None, None, "4", "nvidia:4")),
    ("A10G,A100", (NVIDIA, ("A10G", "A100"), None, "1..", "A10G,A100")),
    ("A10G, A100 :2", (NVIDIA, ("A10G", "A100"), None, "2", "A10G,A100:2")),
    ("tt:32", (TT, None, None, "32", "tenstorrent:32")),
    ("tenstorrent:n150:4", (TT, ("n150",), None, "4", "n150:4")),
    ("amd", (AMD, None, None, "1..", "amd")),
    ("H100:8", (NVIDIA, ("H100",), None, "8", "H100:8")),
    ("h100:8", (NVIDIA, ("H100",), None, "8", "H100:8")),
    ("MI300X:8", (AMD, ("MI300X",), None, "8", "MI300X:8")),
    ("MI300X", (AMD, ("MI300X",), None, "1..", "MI300X")),
    ("v5litepod-8", (GOOGLE, ("v5litepod-8",), None, "1..", "v5litepod-8")),
    ("tpu-v5litepod-8", (GOOGLE, ("v5litepod-8",), None, "1..", "v5litepod-8")),
    ("tpu:v5e", (GOOGLE, ("v5e",), None, "1..", "v5e")),
    ("google", (GOOGLE, None, None, "1..", "google")),
    ("intel:Gaudi2:8", (GPUVendor.INTEL, ("Gaudi2",), None, "8", "Gaudi2:8")),
    ("nvidia:MyGPU", (NVIDIA, ("MyGPU",), None, "1..", "nvidia:MyGPU")),
    ("MyGPU", (None, ("MyGPU",), None, "1..", "MyGPU")),
    ("A100,MI300X", (None, ("A100", "MI300X"), None, "1..", "A100,MI300X")),
    ("A100,a100", (NVIDIA, ("A100",), None, "1..", "A100")),
    ("24GB", (None, None, "24GB", "1..", "24GB")),
    ("48GB", (None, None, "48GB", "1..", "48GB")),
    ("16GB..24GB", (None, None, "16GB..24GB", "1..", "16GB..24GB")),
    ("1..8", (None, None, None, "1..8", "1..8")),
    ("1..", (None, None, None, "1..", "1..")),
    ("0", (None, None, None, "0", "0")),
    ("0..", (None, None, None, "0..", "0..")),
    (2, (None, None, None, "2", "2")),
    (0, (None, None, None, "0", "0")),
    ("2", (None, None, None, "2", "2")),
    (" A100 : 80GB : 2 ", (NVIDIA, ("A100",), "80GB", "2", "A100:80GB:2")),
    ("nvidia:A100:80GB..:2..", (NVIDIA, ("A100",), "80GB..", "2..", "A100:80GB..:2..")),
    ({"name": "A100", "count": 2}, (NVIDIA, ("A100",), None, "2", "A100:2")),
    (
        {"name": ["A10G", "A100"], "memory": "24GB.."},
        (NVIDIA, ("A10G", "A100"), "24GB..", "1..", "A10G,A100:24GB.."),
    ),  # noqa: E501
    ({"name": "A10G,A100"}, (NVIDIA, ("A10G", "A100"), None, "1..", "A10G,A100")),
    ({"vendor": "amd", "count": "1..8"}, (AMD, None, None, "1..8", "amd:1..8")),
    ({"vendor": "TPU"}, (GOOGLE, None, None, "1..", "google")),
    ({"count": {"min": 2, "max": 4}}, (None, None, None, "2..4", "2..4")),
    ({}, (None, None, None, "1..", "1..")),
]


@pytest.mark.parametrize(("given_value", "expected"), GPU_FORMS)
def test_gpu_forms(given_value: object, expected: tuple[Any, Any, Any, str, str]) -> None:
    vendor, names, mem, cnt, printed = expected
    gpu = GPUSpec.model_validate(given_value)
    assert gpu.vendor is vendor
    assert gpu.name == names
    assert gpu.memory == (None if mem is None else memory(mem))
    assert gpu.count == count(cnt)
    assert str(gpu) == gpu.shorthand() == printed
    assert gpu.model_dump() == printed
    assert gpu.model_dump(mode="json") == printed
    assert GPUSpec.model_validate(printed) == gpu
    assert GPUSpec.parse(given_value) == gpu


def test_gpu_object_form_with_total_memory_and_compute_capability() -> None:
    gpu = GPUSpec.model_validate(
        {"name": "A100", "count": "2..", "total_memory": "160GB..", "compute_capability": 8}
    )
    assert gpu.vendor is NVIDIA
    assert gpu.total_memory == memory("160GB..")
    assert gpu.compute_capability == (8, 0)
    dumped = gpu.model_dump(mode="json")
    assert dumped == {
        "vendor": "nvidia",
        "name": ["A100"],
        "count": "2..",
        "total_memory": "160GB..",
        "compute_capability": "8.0",
    }
    assert GPUSpec.model_validate(dumped) == gpu
    assert str(gpu) == "A100:2.. total_memory=160GB.. compute_capability=8.0"


@pytest.mark.parametrize(
    ("given_value", "expected"),
    [(7.5, (7, 5)), ("7.5", (7, 5)), (8, (8, 0)), ("9.0", (9, 0)), ([8, 6], (8, 6))],
)
def test_gpu_compute_capability(given_value: object, expected: tuple[int, int]) -> None:
    gpu = GPUSpec.model_validate({"compute_capability": given_value})
    assert gpu.compute_capability == expected
    assert GPUSpec.model_validate(gpu.model_dump(mode="json")) == gpu


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("A100:2:3", "invalid gpu spec 'A100:2:3': count given twice (2 and 3)"),
        ("nvidia:amd", "invalid gpu spec 'nvidia:amd': vendor given twice (nvidia and amd)"),
        ("A100:H100", "name given twice (A100 and H100)"),
        ("24GB:80GB", "memory given twice (24GB and 80GB)"),
        ("amd:A100", "A100 is made by nvidia, but vendor amd was given"),
        ("google:H100", "H100 is made by nvidia, but vendor google was given"),
        ("A100::2", "invalid gpu spec 'A100::2': empty part; expected parts separated by ':'"),
        ("", "invalid gpu spec '': empty part"),
        (":", "empty part"),
        ("A100:8..2", "invalid gpu spec 'A100:8..2': invalid count range '8..2': min 8 is"),
        ("A100:80XB", "invalid gpu spec 'A100:80XB': invalid memory range '80XB'"),
        ("A100:..", "invalid count range '..': a range needs at least one bound"),
        ("A100:1:2:3:4:5", "more than 5 parts"),
        ("A100$", "'A100$' is not a GPU name"),
        ("A100,", "'' is not a GPU name"),
        ("A" * 300, "too long"),
        ("Ä100", "invalid memory range 'Ä100'"),
        (-1, "invalid count -1: must not be negative"),
        (2.5, "invalid count 2.5"),
        (True, "invalid gpu spec true: expected parts separated by ':'"),
        (None, "invalid gpu spec null"),
        ([1], "invalid gpu spec a list"),
        ({"names": "A100"}, "invalid gpu spec: unknown key(s) names; expected vendor, name,"),
        ({"vendor": "acme"}, "unknown GPU vendor 'acme'; expected nvidia, amd"),
        ({"name": "amd"}, "'amd' is a vendor, not a GPU name"),
        ({"name": ["A100", "TPU"]}, "'TPU' is a vendor, not a GPU name"),
        ("A100,nvidia:2", "'nvidia' is a vendor, not a GPU name"),
        ({"vendor": 3}, "unknown GPU vendor 3"),
        ({"name": []}, "name a list is not a name or list of names"),
        ({"name": [3]}, "3 is not a GPU name"),
        ({"vendor": "amd", "name": "H100"}, "H100 is made by nvidia, but vendor amd"),
        ({"count": "x"}, "invalid count range 'x'"),
        ({"compute_capability": "eight"}, "compute_capability 'eight' is not a version"),
        ({"compute_capability": float("nan")}, "compute_capability nan"),
        ({"compute_capability": [8]}, "compute_capability a list"),
    ],
)
def test_gpu_errors(bad: object, fragment: str) -> None:
    assert fragment in value_error(GPUSpec, bad)
    with pytest.raises(ValueError):
        GPUSpec.parse(bad)


def test_gpu_error_in_object_form_points_at_the_key() -> None:
    with pytest.raises(ValidationError) as caught:
        ResourcesSpec.model_validate({"gpu": {"name": "A100", "count": "8..2"}})
    assert caught.value.errors()[0]["loc"] == ("gpu", "count")


def test_gpu_vendor_inference() -> None:
    assert gpu_vendor_of("a10g") is NVIDIA
    assert gpu_vendor_of("MI325X") is AMD
    assert gpu_vendor_of("V100") is NVIDIA
    assert gpu_vendor_of("v5e") is GOOGLE
    assert gpu_vendor_of("v6e-8") is GOOGLE
    assert gpu_vendor_of("n300") is TT
    assert gpu_vendor_of("Gaudi3") is GPUVendor.INTEL
    assert gpu_vendor_of("MyGPU") is None
    assert infer_gpu_vendor(("A100", "H100")) is NVIDIA
    assert infer_gpu_vendor(("A100", "MI300X")) is None
    assert infer_gpu_vendor(("A100", "MyGPU")) is None
    assert infer_gpu_vendor(None) is None


VENDORS = st.none() | st.sampled_from(list(GPUVendor))
KNOWN_NAMES = st.sampled_from(["A100", "H100", "A10G", "L4", "MI300X", "MI250", "v5e", "n150"])
OTHER_NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9_+-]{0,10}", fullmatch=True)
COUNT_BOUNDS = st.integers(min_value=0, max_value=64)
MEMORY_BOUNDS = st.integers(min_value=1, max_value=4096).map(lambda mb: mb / 4)


def _range(range_cls: type[Any], bounds: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    def build(pair: tuple[Any, Any]) -> Any:
        low, high = pair
        if low is not None and high is not None and low > high:
            low, high = high, low
        return range_cls(min=low, max=high)

    pairs = st.tuples(st.none() | bounds, st.none() | bounds)
    return pairs.filter(lambda pair: pair != (None, None)).map(build)


@st.composite
def gpu_specs(draw: st.DrawFn) -> GPUSpec:
    """A valid GPUSpec built from its components (invalid vendor/name pairs are skipped)."""
    names = draw(st.none() | st.lists(KNOWN_NAMES | OTHER_NAMES, min_size=1, max_size=3))
    fields: dict[str, Any] = {
        "vendor": draw(VENDORS),
        "name": names,
        "count": draw(_range(CountRange, COUNT_BOUNDS)),
        "memory": draw(st.none() | _range(MemoryRange, MEMORY_BOUNDS)),
    }
    try:
        return GPUSpec.model_validate(fields)
    except ValidationError:
        # A known name from another vendor, or a name that spells a vendor keyword.
        return GPUSpec.model_validate({**fields, "vendor": None, "name": None})


@given(gpu_specs())
def test_gpu_round_trip(gpu: GPUSpec) -> None:
    printed = str(gpu)
    assert GPUSpec.model_validate(printed) == gpu
    assert GPUSpec.model_validate(gpu.model_dump(mode="json")) == gpu


# --- CPU and disk ---------------------------------------------------------------------------

CPU_FORMS: list[tuple[object, Any, str, str]] = [
    ("16..", None, "16..", "16.."),
    ("arm:8..", CPUArch.ARM, "8..", "arm:8.."),
    ("8..:ARM", CPUArch.ARM, "8..", "arm:8.."),
    ("x86:16", CPUArch.X86, "16", "x86:16"),
    ("x86", CPUArch.X86, "2..", "x86:2.."),
    ("4", None, "4", "4"),
    ("2..8", None, "2..8", "2..8"),
    ("..8", None, "..8", "..8"),
    (4, None, "4", "4"),
    ({"arch": "arm", "count": 8}, CPUArch.ARM, "8", "arm:8"),
    ({"arch": "X86"}, CPUArch.X86, "2..", "x86:2.."),
    ({"count": "4..16"}, None, "4..16", "4..16"),
    ({}, None, "2..", "2.."),
]


@pytest.mark.parametrize(("given_value", "arch", "cnt", "printed"), CPU_FORMS)
def test_cpu_forms(given_value: object, arch: Any, cnt: str, printed: str) -> None:
    cpu = CPUSpec.model_validate(given_value)
    assert cpu.arch is arch
    assert cpu.count == count(cnt)
    assert str(cpu) == printed
    assert cpu.model_dump(mode="json") == printed
    assert CPUSpec.model_validate(printed) == cpu


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("arm:x86", "invalid cpu spec 'arm:x86': arch given twice"),
        ("4:8", "invalid cpu spec '4:8': count given twice"),
        ("risc:4", "'risc' is neither a count range nor an arch (x86 or arm)"),
        ("arm:4:8", "more than 2 parts"),
        ("arm:", "empty part"),
        ("8..2", "invalid cpu spec '8..2': invalid count range '8..2': min 8 is greater"),
        ("", "invalid cpu spec '': empty part"),
        (None, "invalid cpu spec null: expected a count range"),
        (True, "invalid cpu spec true"),
        (-2, "must not be negative"),
        ({"arch": "mips"}, "'mips' is neither a count range nor an arch"),
        ({"cores": 4}, "invalid cpu spec: unknown key(s) cores; expected arch, count"),
    ],
)
def test_cpu_errors(bad: object, fragment: str) -> None:
    assert fragment in value_error(CPUSpec, bad)


DISK_FORMS: list[tuple[object, str]] = [
    ("500GB..", "500GB.."),
    ("100GB..1TB", "100GB..1TB"),
    ("150GB", "150GB"),
    (200, "200GB"),
    ({"size": "500GB.."}, "500GB.."),
    ({"size": 100}, "100GB"),
    ({"min": "100GB"}, "100GB.."),
    ({}, "100GB.."),
]


@pytest.mark.parametrize(("given_value", "printed"), DISK_FORMS)
def test_disk_forms(given_value: object, printed: str) -> None:
    disk = DiskSpec.model_validate(given_value)
    assert str(disk) == printed
    assert disk.model_dump(mode="json") == printed
    assert DiskSpec.model_validate(printed) == disk
    assert disk.size == memory(printed)


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("abc", "invalid memory range 'abc'"),
        ("500GB..100GB", "min 500GB is greater than max 100GB"),
        ({"size": "x"}, "invalid memory range 'x'"),
        ({"size": 1, "min": 1}, "invalid disk spec: unknown key(s) min; expected size"),
        (None, "invalid disk spec null"),
    ],
)
def test_disk_errors(bad: object, fragment: str) -> None:
    assert fragment in value_error(DiskSpec, bad)


# --- resources ------------------------------------------------------------------------------


def test_resources_defaults() -> None:
    spec = ResourcesSpec()
    assert spec.cpu == CPUSpec(count=CountRange(min=2))
    assert spec.memory == memory("8GB..")
    assert spec.shm_size is None
    assert spec.disk.size == memory("100GB..")
    assert spec.gpu.count == count("0..")
    assert spec.gpu.vendor is None and spec.gpu.name is None
    assert str(spec) == spec.pretty() == "cpu=2.. mem=8GB.. disk=100GB.."
    assert spec.model_dump(mode="json") == {
        "cpu": "2..",
        "memory": "8GB..",
        "shm_size": None,
        "disk": "100GB..",
        "gpu": "0..",
    }
    assert ResourcesSpec.model_validate({}) == spec


def test_gpu_given_without_count_means_at_least_one() -> None:
    assert ResourcesSpec.model_validate({"gpu": "A100"}).gpu.count == count("1..")
    assert ResourcesSpec.model_validate({"gpu": {"name": "A100"}}).gpu.count == count("1..")
    assert ResourcesSpec.model_validate({"gpu": "nvidia"}).gpu.count == count("1..")


RESOURCES: list[tuple[dict[str, Any], str]] = [
    (
        {
            "cpu": "16..",
            "memory": "200GB..",
            "shm_size": "24GB",
            "disk": "500GB..",
            "gpu": "A100:80GB:2",
        },  # noqa: E501
        "cpu=16.. mem=200GB.. disk=500GB.. gpu=A100:80GB:2 shm=24GB",
    ),
    ({"gpu": "1..8", "shm_size": "16GB"}, "cpu=2.. mem=8GB.. disk=100GB.. gpu=1..8 shm=16GB"),
    (
        {"gpu": "MI300X:8", "shm_size": "32GB"},
        "cpu=2.. mem=8GB.. disk=100GB.. gpu=MI300X:8 shm=32GB",
    ),  # noqa: E501
    ({"gpu": "MI300X", "disk": "150GB"}, "cpu=2.. mem=8GB.. disk=150GB gpu=MI300X"),
    ({"gpu": "24GB..:1..8"}, "cpu=2.. mem=8GB.. disk=100GB.. gpu=24GB..:1..8"),
    ({"gpu": "v5litepod-8"}, "cpu=2.. mem=8GB.. disk=100GB.. gpu=v5litepod-8"),
    ({"cpu": "arm:8.."}, "cpu=arm:8.. mem=8GB.. disk=100GB.."),
    ({"disk": "500GB.."}, "cpu=2.. mem=8GB.. disk=500GB.."),
    ({"memory": "200GB.."}, "cpu=2.. mem=200GB.. disk=100GB.."),
    ({"memory": {"min": 16, "max": "64GB"}}, "cpu=2.. mem=16GB..64GB disk=100GB.."),
    ({"gpu": 0}, "cpu=2.. mem=8GB.. disk=100GB.. gpu=0"),
    ({"gpu": "0.."}, "cpu=2.. mem=8GB.. disk=100GB.."),
    ({"cpu": 4, "memory": 16, "disk": {"size": "1TB.."}}, "cpu=4 mem=16GB disk=1TB.."),
    ({"shm_size": 0.5}, "cpu=2.. mem=8GB.. disk=100GB.. shm=512MB"),
]


@pytest.mark.parametrize(("block", "pretty"), RESOURCES)
def test_resources_forms(block: dict[str, Any], pretty: str) -> None:
    spec = ResourcesSpec.model_validate(block)
    assert spec.pretty() == str(spec) == pretty
    dumped = spec.model_dump(mode="json")
    assert all(isinstance(v, str) or v is None for v in dumped.values())
    assert spec.model_dump() == dumped
    assert ResourcesSpec.model_validate(dumped) == spec
    # The pretty fields are the canonical field strings: parsing them back is the same spec.
    fields = dict(part.split("=", 1) for part in pretty.split())
    renamed = {"mem": "memory", "shm": "shm_size"}
    assert ResourcesSpec.model_validate({renamed.get(k, k): v for k, v in fields.items()}) == spec


def test_resources_errors() -> None:
    with pytest.raises(ValidationError) as caught:
        ResourcesSpec.model_validate({"gpus": 2})
    assert caught.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(ValidationError) as caught:
        ResourcesSpec.model_validate({"gpu": "A100:2:3", "memory": "lots", "shm_size": "x"})
    locs = {error["loc"][0]: error["msg"] for error in caught.value.errors()}
    assert "count given twice" in locs["gpu"]
    assert "invalid memory range 'lots'" in locs["memory"]
    assert "invalid memory size 'x'" in locs["shm_size"]
    assert all(error["type"] == "value_error" for error in caught.value.errors())
    with pytest.raises(ValidationError):
        ResourcesSpec.model_validate({"cpu": None})
    spec = ResourcesSpec()
    with pytest.raises(ValidationError):
        spec.cpu = CPUSpec()  # type: ignore[misc]


def test_resources_in_a_config_model() -> None:
    class Task(BaseModel):
        resources: ResourcesSpec = ResourcesSpec()

    task = Task.model_validate({"resources": {"gpu": "H100:8", "cpu": "x86:32.."}})
    assert task.model_dump(mode="json")["resources"]["gpu"] == "H100:8"
    assert Task.model_validate(task.model_dump(mode="json")) == task
    assert Task().resources == ResourcesSpec()


@given(
    gpu_specs(),
    st.none() | st.sampled_from(CPUArch),
    _range(CountRange, st.integers(min_value=1, max_value=256)),
    _range(MemoryRange, MEMORY_BOUNDS),
    st.none() | MEMORY_BOUNDS,
)
def test_resources_round_trip(
    gpu: GPUSpec, arch: CPUArch | None, cpus: CountRange, mem: MemoryRange, shm: float | None
) -> None:
    spec = ResourcesSpec(cpu=CPUSpec(arch=arch, count=cpus), memory=mem, shm_size=shm, gpu=gpu)
    assert ResourcesSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert ResourcesSpec.model_validate(spec.model_dump()) == spec


# --- JSON Schema ----------------------------------------------------------------------------

SCHEMA = ResourcesSpec.model_json_schema()

SCHEMA_ACCEPTS: list[dict[str, Any]] = [
    {},
    {"gpu": "1..8", "shm_size": "16GB"},
    {"gpu": "MI300X:8"},
    {"gpu": "MI300X", "disk": "150GB"},
    {"gpu": "24GB..:1..8"},
    {"gpu": "24GB"},
    {"gpu": "16GB..24GB"},
    {"gpu": "v5litepod-8"},
    {"gpu": "A100:80GB:2"},
    {"gpu": "nvidia:4"},
    {"gpu": "A10G,A100"},
    {"gpu": "tt:32"},
    {"gpu": "amd"},
    {"gpu": "H100:8"},
    {"gpu": 2},
    {"gpu": {"name": ["A100", "H100"], "count": "2..", "memory": "40GB.."}},
    {"gpu": {"vendor": "AMD", "count": 8, "total_memory": "1TB..", "compute_capability": 8.0}},
    {"gpu": {"name": "A10G,A100", "compute_capability": "7.5"}},
    {"cpu": "arm:8.."},
    {"cpu": "x86:16"},
    {"cpu": 16},
    {"cpu": {"arch": "arm", "count": "8.."}},
    {"disk": "500GB.."},
    {"disk": {"size": "500GB.."}},
    {"disk": 200},
    {"memory": "200GB.."},
    {"memory": 64},
    {"memory": {"min": "64GB"}},
    {"shm_size": 8},
    {"cpu": "16..", "memory": "200GB..", "shm_size": "24GB", "disk": "500GB..", "gpu": "A100:2"},
]


@pytest.mark.parametrize("block", SCHEMA_ACCEPTS)
def test_json_schema_accepts_user_forms(block: dict[str, Any]) -> None:
    jsonschema.validate(block, SCHEMA)
    spec = ResourcesSpec.model_validate(block)
    jsonschema.validate(spec.model_dump(mode="json", exclude_none=True), SCHEMA)


@pytest.mark.parametrize(
    "block",
    [
        {"gpus": 2},
        {"gpu": "A100::2"},
        {"gpu": True},
        {"gpu": {"names": "A100"}},
        {"gpu": {"vendor": "acme"}},
        {"cpu": "arm:x86:2"},
        {"cpu": "risc"},
        {"disk": "abc"},
        {"disk": {"size": "1GB", "min": 1}},
        {"memory": "lots"},
        {"shm_size": "16XB"},
    ],
)
def test_json_schema_rejects_invalid_forms(block: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(block, SCHEMA)
    with pytest.raises(ValidationError):
        ResourcesSpec.model_validate(block)


# A config document whose `resources:` is the published schema; `$ref`s resolve at the root.
SCHEMA_OF_CONFIG = {
    "type": "object",
    "properties": {"resources": SCHEMA},
    "$defs": SCHEMA.get("$defs", {}),
}


YAML_BLOCKS = [
    "resources: {gpu: 1..8, shm_size: 16GB}",
    "resources:\n  gpu: MI300X:8\n  shm_size: 32GB",
    "resources:\n  gpu: 24GB..:1..8",
    "resources:\n  cpu: arm:8..\n  disk: 500GB..\n  memory: 200GB..",
    "resources:\n  gpu: 'A100:80GB:2'  # quoted\n  disk: {size: 150GB}",
    'resources:\n  gpu: {name: [A10G, A100], count: "1..2"}\n  cpu: 16',
]


@pytest.mark.parametrize("text", YAML_BLOCKS)
@pytest.mark.parametrize("loader", ["pyyaml", "ruamel-rt"])
def test_yaml_blocks_validate_and_match_the_schema(text: str, loader: str) -> None:
    if loader == "pyyaml":
        document = yaml.safe_load(text)
    else:
        document = ruamel.yaml.YAML(typ="rt").load(text)  # str subclasses, CommentedMap
        document = {"resources": dict(document["resources"])}
    jsonschema.validate(json.loads(json.dumps(document)), SCHEMA_OF_CONFIG)
    spec = ResourcesSpec.model_validate(document["resources"])
    assert ResourcesSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_json_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


# --- robustness and speed -------------------------------------------------------------------

JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.text(alphabet="0123456789.:,GBMTgbAHVIXnvidatpu ", max_size=20),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["name", "vendor", "count", "memory", "arch", "size", "min", "max"]),
            children,
            max_size=3,
        )
    ),
    max_leaves=6,
)


@given(JSONISH)
def test_any_input_validates_or_raises_validation_error(value: object) -> None:
    for model in (GPUSpec, CPUSpec, DiskSpec):
        try:
            parsed = model.model_validate(value)
        except ValidationError:
            continue
        assert model.model_validate(parsed.model_dump(mode="json")) == parsed
    try:
        ResourcesSpec.model_validate({"gpu": value, "cpu": value})
    except ValidationError:
        pass
