"""The `gpu:` share syntax (shared GPUs, an extension): every form, every error, round trips,
and that no config dstack accepts changes meaning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from dstack_plan.config.gpu import GPUSpec, GPUVendor
from dstack_plan.config.gpu_share import SHARE_HELP, format_share, parse_share
from dstack_plan.config.loader import load_text
from dstack_plan.config.ranges import CountRange, MemoryRange
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.plan.normalize import spec_from_normalized
from tests.conftest import DSTACK_EXAMPLES, REPO_ROOT
from tests.unit.test_resources import GPU_FORMS

NVIDIA = GPUVendor.NVIDIA
ONE = CountRange(min=1, max=1)


def value_error(model: type[BaseModel], value: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(value)
    return caught.value


# given -> (share in thousandths, vendor, names, memory, canonical shorthand)
FORMS: list[tuple[object, tuple[int, Any, Any, str | None, str]]] = [
    ("25%", (250, None, None, None, "25%")),
    ("A10G:25%", (250, NVIDIA, ("A10G",), None, "A10G:25%")),
    ("25%:A10G", (250, NVIDIA, ("A10G",), None, "A10G:25%")),
    ("nvidia:24GB..:12.5%", (125, NVIDIA, None, "24GB..", "nvidia:24GB..:12.5%")),
    ("nvidia:A10G,L4:24GB..:1:50%", (500, NVIDIA, ("A10G", "L4"), "24GB..", "A10G,L4:24GB..:50%")),
    ("A10G:1:25%", (250, NVIDIA, ("A10G",), None, "A10G:25%")),
    ("A10G: 25 % ", (250, NVIDIA, ("A10G",), None, "A10G:25%")),
    ("0.1%", (1, None, None, None, "0.1%")),
    ("99.9%", (999, None, None, None, "99.9%")),
    ("12.50%", (125, None, None, None, "12.5%")),
    ("033%", (330, None, None, None, "33%")),
    ({"name": "A10G", "share": "25%"}, (250, NVIDIA, ("A10G",), None, "A10G:25%")),
    ({"name": "A10G", "share": 0.25}, (250, NVIDIA, ("A10G",), None, "A10G:25%")),
    ({"share": "25%", "count": 1}, (250, None, None, None, "25%")),
    ({"share": "25%", "count": "1"}, (250, None, None, None, "25%")),
    ({"share": 0.125, "memory": "24GB"}, (125, None, None, "24GB", "24GB:12.5%")),
    ({"share": 0.001}, (1, None, None, None, "0.1%")),
    ({"share": 0.5, "vendor": "amd"}, (500, GPUVendor.AMD, None, None, "amd:50%")),
    (0.5, (500, None, None, None, "50%")),
    (0.25, (250, None, None, None, "25%")),
    (0.001, (1, None, None, None, "0.1%")),
    (0.999, (999, None, None, None, "99.9%")),
]


@pytest.mark.parametrize(("given_value", "expected"), FORMS)
def test_share_forms(given_value: object, expected: tuple[int, Any, Any, str | None, str]) -> None:
    share, vendor, names, mem, printed = expected
    gpu = GPUSpec.model_validate(given_value)
    assert gpu.share == share
    assert gpu.count == ONE  # a share is part of exactly one GPU
    assert gpu.vendor is vendor
    assert gpu.name == names
    assert gpu.memory == (None if mem is None else MemoryRange.parse(mem))
    assert gpu.total_memory is None
    assert str(gpu) == gpu.shorthand() == printed
    assert gpu.model_dump() == gpu.model_dump(mode="json") == printed
    assert GPUSpec.model_validate(printed) == gpu
    assert GPUSpec.parse(given_value) == gpu


def test_bare_fraction_in_resources() -> None:
    spec = ResourcesSpec.model_validate({"gpu": 0.5})
    assert spec.gpu.share == 500 and spec.gpu.count == ONE
    assert str(spec) == "cpu=2.. mem=8GB.. disk=100GB.. gpu=50%"
    assert spec.model_dump(mode="json")["gpu"] == "50%"
    assert ResourcesSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_share_with_compute_capability_uses_the_object_form() -> None:
    gpu = GPUSpec.model_validate({"name": "A10G", "share": "12.5%", "compute_capability": 8.6})
    dumped = gpu.model_dump(mode="json")
    assert dumped == {
        "vendor": "nvidia",
        "name": ["A10G"],
        "count": "1",
        "compute_capability": "8.6",
        "share": "12.5%",
    }
    assert GPUSpec.model_validate(dumped) == gpu
    assert str(gpu) == "A10G:12.5% compute_capability=8.6"


def test_no_share_is_whole_gpus() -> None:
    assert GPUSpec.model_validate({"name": "A10G", "share": None}).share is None
    for whole in (0, 1, 2, 0.0, 1.0, 8.0, "2", "A100:2"):
        gpu = GPUSpec.model_validate(whole)
        assert gpu.share is None and gpu.count.min == gpu.count.max
    assert GPUSpec.model_validate(1.0).count == ONE
    assert GPUSpec.model_validate(0.0).count == CountRange(min=0, max=0)


@pytest.mark.parametrize(
    ("thousandths", "text"), [(1, "0.1%"), (5, "0.5%"), (10, "1%"), (125, "12.5%"), (999, "99.9%")]
)
def test_format_share(thousandths: int, text: str) -> None:
    assert format_share(thousandths) == text
    assert parse_share("gpu spec", text) == thousandths


ERRORS: list[tuple[object, str]] = [
    ("12.55%", "invalid gpu spec '12.55%': share '12.55%' is finer than 0.1%"),
    ("0.05%", "share '0.05%' is finer than 0.1%"),
    ("0%", "invalid gpu spec '0%': share '0%' is out of range"),
    ("100%", "share '100%' is out of range"),
    ("150%", "share '150%' is out of range"),
    ("A10G:-20%", "share '-20%' is not a percentage or fraction"),
    ("A10G:.5%", "share '.5%' is not a percentage or fraction"),
    ("A10G:25%%", "share '25%%' is not a percentage or fraction"),
    ("A10G:" + "1" * 30 + "%", "is not a percentage or fraction"),
    ("25%:50%", "share given twice (25% and 50%)"),
    (
        "A100:2:50%",
        "invalid gpu spec 'A100:2:50%': a GPU share is part of one GPU: count must be 1, got 2",
    ),  # noqa: E501
    ("0..1:50%", "a GPU share is part of one GPU: count must be 1, got 0..1"),
    ("1..:50%", "count must be 1, got 1.."),
    ("A10G:1:2:3:4:5", "more than 5 parts"),
    (1.5, "invalid count 1.5: expected a non-negative integer (whole GPUs) or a share"),
    (-0.2, "invalid count -0.2"),
    (2.5, "invalid count 2.5"),
    (float("nan"), "invalid count nan"),
    (1e-4, "share 0.0001 is finer than 0.1%"),
    (0.2555, "share 0.2555 is finer than 0.1%"),
    ({"share": 1.5}, "invalid gpu spec: share 1.5 is out of range"),
    ({"share": -0.2}, "share -0.2 is out of range"),
    ({"share": 0}, "share 0 is out of range"),
    ({"share": 1}, "share 1 is out of range"),
    ({"share": 25}, "share 25 is out of range"),
    ({"share": 1.0}, "share 1.0 is out of range"),
    ({"share": "150%"}, "share '150%' is out of range"),
    ({"share": "12.55%"}, "share '12.55%' is finer than 0.1%"),
    ({"share": "half"}, "share 'half' is not a percentage or fraction"),
    ({"share": "0.25"}, "share '0.25' is not a percentage or fraction"),
    ({"share": True}, "share true is not a percentage or fraction"),
    ({"share": [0.5]}, "share a list is not a percentage or fraction"),
    ({"share": "25%", "count": 2}, "a GPU share is part of one GPU: count must be 1, got 2"),
    ({"share": "25%", "count": "0..1"}, "count must be 1, got 0..1"),
    ({"share": "25%", "total_memory": "80GB"}, "so total_memory does not apply"),
    ({"share": "25%", "count": "x"}, "invalid count range 'x'"),
    ({"shares": "25%"}, "unknown key(s) shares; expected vendor, name, count, memory"),
]


@pytest.mark.parametrize(("bad", "fragment"), ERRORS)
def test_share_errors(bad: object, fragment: str) -> None:
    message = str(value_error(GPUSpec, bad).errors()[0]["msg"])
    assert fragment in message
    if "share" in fragment and not any(w in fragment for w in ("count", "unknown", "twice")):
        assert SHARE_HELP in message  # every share error says what a share is
    with pytest.raises(ValueError):
        GPUSpec.parse(bad)


def test_share_help_wording() -> None:
    assert SHARE_HELP == (
        "a share is part of one GPU: a percentage below 100% such as 25%, "
        "or a fraction below 1 such as 0.25"
    )


def test_constructor_guards_the_invariant() -> None:
    # However a spec is built, a share never comes with other than one GPU.
    with pytest.raises(ValidationError, match="count must be 1, got 2"):
        GPUSpec(share="25%", count=CountRange(min=2, max=2))  # type: ignore[arg-type]
    assert GPUSpec(share=0.25).count == ONE  # type: ignore[arg-type]


TASK = "type: task\ncommands: [x]\nresources:\n"
# (gpu block under resources, line, column, message fragment)
LOCATED = [
    ("  gpu: A100:2:50%\n", 4, 8, "resources.gpu: invalid gpu spec 'A100:2:50%': a GPU share"),
    ("  gpu: 150%\n", 4, 8, "resources.gpu: invalid gpu spec '150%': share '150%' is out"),
    ("  gpu: 12.55%\n", 4, 8, "is finer than 0.1%; " + SHARE_HELP),
    ("  gpu: 1.5\n", 4, 8, "resources.gpu: invalid count 1.5"),
    ("  gpu:\n    name: A10G\n    share: 1.5\n", 6, 12, "resources.gpu.share: invalid gpu"),
    ("  gpu: {name: A10G, share: '0%'}\n", 4, 28, "resources.gpu.share: invalid gpu spec"),
    ("  gpu:\n    share: 25%\n    count: 2\n", 6, 12, "resources.gpu.count: invalid gpu spec"),
    ("  gpu: {share: 25%, total_memory: 80GB}\n", 4, 35, "resources.gpu.total_memory:"),
]


@pytest.mark.parametrize(("block", "line", "column", "fragment"), LOCATED)
def test_share_errors_are_located(block: str, line: int, column: int, fragment: str) -> None:
    _, issues = load_text(TASK + block, "bad.dstack.yml")
    assert issues, "expected an error"
    first = issues[0]
    assert (first.line, first.column) == (line, column), str(first)
    assert fragment in first.message, str(first)
    assert str(first).startswith(f"bad.dstack.yml:{line}:{column}: error: ")


@pytest.mark.parametrize(
    "block",
    ["  gpu: 25%\n", "  gpu: A10G:25%\n", "  gpu: 0.5\n", "  gpu: {name: A10G, share: 12.5%}\n"],
)
def test_a_stored_spec_reads_back_equal(block: str) -> None:
    resources, issues = load_text(TASK + block, "t.dstack.yml")
    assert not issues
    resource = resources[0]
    assert resource.spec.resources.gpu.share is not None  # type: ignore[union-attr]
    stored = json.loads(json.dumps(resource.normalized))  # as state and plan files keep it
    again = spec_from_normalized(resource.kind, stored)
    assert again.resources == resource.spec.resources  # type: ignore[union-attr]
    assert again.model_dump(mode="json", exclude_none=True) == stored  # a no-op re-plan


# --- round trips ----------------------------------------------------------------------------

NAMES = st.none() | st.lists(
    st.sampled_from(["A10G", "L4", "T4", "A100", "MyGPU", "MI300X", "v5e"]), min_size=1, max_size=2
)
MEMORY = st.none() | st.sampled_from(["24GB", "16GB..", "..80GB", "20GB..48GB", "0.5GB.."])


@st.composite
def shared_specs(draw: st.DrawFn) -> GPUSpec:
    """A valid GPUSpec with a share, given in one of the user forms."""
    thousandths = draw(st.integers(min_value=1, max_value=999))
    share = draw(st.sampled_from([format_share(thousandths), thousandths / 1000]))
    fields: dict[str, Any] = {"name": draw(NAMES), "memory": draw(MEMORY), "share": share}
    if draw(st.booleans()):
        fields["compute_capability"] = draw(st.sampled_from(["7.5", "8.0", "9.0"]))
    if draw(st.booleans()):
        fields["count"] = 1
    gpu = GPUSpec.model_validate(fields)
    assert gpu.share == thousandths
    return gpu


@given(shared_specs())
def test_share_round_trip(gpu: GPUSpec) -> None:
    assert GPUSpec.model_validate(str(gpu).split(" ")[0]).share == gpu.share
    if gpu.compute_capability is None:
        assert GPUSpec.model_validate(str(gpu)) == gpu
        assert GPUSpec.parse(gpu.shorthand()) == gpu
    dumped = json.loads(json.dumps(gpu.model_dump(mode="json")))
    assert GPUSpec.model_validate(dumped) == gpu
    resources = ResourcesSpec(gpu=gpu)
    assert ResourcesSpec.model_validate(resources.model_dump(mode="json")) == resources


@given(st.integers(min_value=1, max_value=999))
def test_every_thousandth_round_trips(thousandths: int) -> None:
    text = format_share(thousandths)
    assert parse_share("gpu spec", text) == thousandths
    assert parse_share("gpu spec", thousandths / 1000) == thousandths
    assert GPUSpec.model_validate(thousandths / 1000) == GPUSpec.model_validate(text)


# --- JSON Schema ----------------------------------------------------------------------------

SCHEMA = ResourcesSpec.model_json_schema()
TASK_SCHEMA = json.loads((REPO_ROOT / "schemas" / "task.schema.json").read_text())


@pytest.mark.parametrize(
    "gpu",
    [
        "25%",
        "A10G:25%",
        "nvidia:24GB..:12.5%",
        "A10G: 25 %",
        0.5,
        {"name": "A10G", "share": "25%"},
        {"share": 0.25},
        {"share": "12.5%", "memory": "24GB.."},
    ],
)
def test_schema_accepts_share_forms(gpu: object) -> None:
    jsonschema.validate({"gpu": gpu}, SCHEMA)
    task = {"type": "task", "commands": ["x"], "resources": {"gpu": gpu}}
    jsonschema.validate(task, TASK_SCHEMA)
    spec = ResourcesSpec.model_validate({"gpu": gpu})
    jsonschema.validate(spec.model_dump(mode="json", exclude_none=True), SCHEMA)


@pytest.mark.parametrize(
    "gpu",
    [1.5, -0.2, "A10G:25%%", "A10G:-20%", {"share": 1.5}, {"share": 0}, {"share": "25"}],
)
def test_schema_rejects_bad_shares(gpu: object) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"gpu": gpu}, SCHEMA)
    with pytest.raises(ValidationError):
        ResourcesSpec.model_validate({"gpu": gpu})


# --- valid dstack configs keep their meaning ------------------------------------------------


def _gpu_specs_in(value: object) -> list[GPUSpec]:
    """Every GPUSpec anywhere in a parsed spec (runs, fleets, service replica groups)."""
    if isinstance(value, GPUSpec):
        return [value]
    if isinstance(value, BaseModel):
        value = [getattr(value, name) for name in type(value).model_fields]
    if isinstance(value, (list, tuple)):
        return [gpu for item in value for gpu in _gpu_specs_in(item)]
    if isinstance(value, dict):
        return [gpu for item in value.values() for gpu in _gpu_specs_in(item)]
    return []


def _corpus() -> list[tuple[str, str]]:
    texts = [(str(case_file), case_file.read_text()) for case_file in _config_files()]
    for area in sorted((REPO_ROOT / "tests" / "conformance").glob("*.yml")):
        for case in yaml.safe_load(area.read_text(encoding="utf-8")) or []:
            texts.append((f"{area.stem}/{case['name']}", case["config"]))
    return texts


def _config_files() -> list[Path]:
    files = sorted(DSTACK_EXAMPLES.glob("*.dstack.yml"))
    return [*files, *sorted((REPO_ROOT / "examples").rglob("*.dstack.yml"))]


def test_no_dstack_config_asks_for_a_share() -> None:
    corpus = _corpus()
    assert len(corpus) > 50
    gpus = 0
    for where, text in corpus:
        resources, _ = load_text(text, "case.dstack.yml", name_hint="case")
        for resource in resources:
            for gpu in _gpu_specs_in(resource.spec):
                gpus += 1
                assert gpu.share is None, where
                assert "%" not in str(gpu), where
    assert gpus > 20


@pytest.mark.parametrize(("given_value", "expected"), GPU_FORMS)
def test_every_dstack_gpu_form_is_whole_gpus(given_value: object, expected: object) -> None:
    assert GPUSpec.model_validate(given_value).share is None
