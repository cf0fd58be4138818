"""Values dstack 0.22.5's parser takes: explicit nulls, numbers it coerces, cpu ranges, presets.

The conformance corpus (`tests/conformance/values.yml`) holds the accept/reject verdicts;
these tests hold what the accepted values mean.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.main import main as agent_main
from dstack_plan.config.loader import load_project, load_text
from dstack_plan.config.preset import PresetSpec
from dstack_plan.config.resource import Resource
from dstack_plan.plan.diff import diff_specs
from tests.conftest import run_main


def one(text: str) -> Resource:
    resources, issues = load_text(text, "v.dstack.yml", name_hint="v")
    assert not issues, [str(i) for i in issues]
    assert len(resources) == 1
    return resources[0]


TASK = "type: task\nname: tt\ncommands: [x]\n"
SERVICE = "type: service\nname: ss\ncommands: [x]\nport: 80\n"
FLEET = "type: fleet\nname: ff\nnodes: 1\n"
GATEWAY = "type: gateway\nname: gg\nbackend: aws\nregion: eu-west-1\n"


# --- an explicit null means "not set" -------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "null"),
    [
        (TASK, "spot_policy: null"),
        (TASK, "nvcc: null"),
        (TASK, "docker: null"),
        (TASK, "priority: null"),
        (TASK, "max_duration: null"),
        (TASK, "stop_duration: null"),
        (TASK, "idle_duration: null"),
        (TASK, "creation_policy: null"),
        (TASK, "retry: {on_events: null, duration: null}"),
        (TASK, "resources: {gpu: null, disk: null}"),
        (SERVICE, "replicas: null"),
        (SERVICE, "https: null"),
        (FLEET, "placement: null"),
        (GATEWAY, "replicas: null"),
    ],
)
def test_a_null_is_the_same_spec_as_no_key(base: str, null: str) -> None:
    key = null.split(":")[0]
    without = one(base if key != "retry" else base + "retry: {}\n")
    if key == "resources":
        without = one(base + "resources: {}\n")
    with_null = one(base + null + "\n")
    assert with_null.spec == without.spec
    # the plan compares normalised specs: no spurious change
    assert with_null.normalized == without.normalized
    assert not diff_specs(with_null.kind, without.normalized, with_null.normalized).changed


def test_a_null_certificate_turns_certificates_off() -> None:
    # the one field where null is a value of its own (dstack: "set to null to disable")
    assert one(GATEWAY + "certificate: null\n").spec.certificate is None  # type: ignore[union-attr]
    assert one(GATEWAY).spec.certificate is not None  # type: ignore[union-attr]


# --- numbers dstack coerces ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "version"),
    [("python: 3.12", "3.12"), ("python: 3.10", "3.10"), ("python: 3.9", "3.9")],
)
def test_python_as_a_yaml_number(line: str, version: str) -> None:
    assert one(TASK + line + "\n").spec.python == version  # type: ignore[union-attr]


def test_a_fractional_duration_drops_the_fraction_as_dstack_does() -> None:
    spec: Any = one(TASK + "retry: {duration: 1.9}\nmax_duration: 90.5\n").spec
    assert (spec.retry.duration, spec.max_duration) == (1, 90)


@pytest.mark.parametrize("value", ["-1", "-5", "'-300'", "-1.5", "off", "false"])
def test_every_negative_idle_duration_is_off(value: str) -> None:
    assert one(FLEET + f"idle_duration: {value}\n").normalized["idle_duration"] == "off"


def test_idle_duration_true_is_the_default() -> None:
    assert one(TASK + "idle_duration: true\n").normalized == one(TASK).normalized


# --- cpu as a range mapping ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu", "printed"),
    [
        ("{min: 1, max: 2}", "1..2"),
        ("{min: 4}", "4.."),
        ("{max: 2}", "..2"),
        ("{min: 2, max: 2}", "2"),
    ],
)
def test_cpu_as_a_min_max_mapping(cpu: str, printed: str) -> None:
    resource = one(TASK + f"resources: {{cpu: {cpu}}}\n")
    assert resource.normalized["resources"]["cpu"] == printed
    # the same spec as the shorthand
    assert resource.spec == one(TASK + f"resources: {{cpu: '{printed}'}}\n").spec


# --- presets -------------------------------------------------------------------------------

PRESET = "type: preset\nname: qwen\nbase: Qwen/Qwen3-8B\ntrials: 3\nspot_policy: spot\n"


def test_a_preset_is_loaded_but_is_no_resource(tmp_path: Path) -> None:
    (tmp_path / "preset.dstack.yml").write_text(PRESET)
    (tmp_path / "task.dstack.yml").write_text(TASK)
    desired = load_project(tmp_path)
    assert list(desired.resources) == ["task.tt"]
    preset = desired.presets["preset.qwen"]
    assert isinstance(preset.spec, PresetSpec)
    # the shorthand `base:` is the model; the profile fields are a preset's own
    assert preset.spec.model.model_dump() == {"base": "Qwen/Qwen3-8B"}
    assert preset.spec.spot_policy == "spot"


def test_two_presets_of_one_name_are_duplicates(tmp_path: Path) -> None:
    (tmp_path / "a.dstack.yml").write_text(PRESET + "---\n" + PRESET)
    with pytest.raises(Exception, match="duplicate resource preset.qwen"):
        load_project(tmp_path)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    agent = tmp_path / "agent"
    monkeypatch.setenv("DSTACK_PLAN_AGENT_DIR", str(agent))
    monkeypatch.delenv("DSTACK_STATE", raising=False)
    (tmp_path / "preset.dstack.yml").write_text(PRESET)
    (tmp_path / "task.dstack.yml").write_text(
        "type: task\nname: count\ncommands: [echo hi]\nresources: {cpu: 1.., memory: 0.1GB..}\n"
    )
    yield tmp_path
    agent_main(["stop", "--data-dir", str(agent)])


def test_validate_counts_presets_apart(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(monkeypatch, capsys, "validate", str(project))
    assert (code, out.strip(), err) == (0, "1 resource and 1 preset OK", "")


def test_plan_leaves_presets_out(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(monkeypatch, capsys, "plan", str(project))
    assert code == 0, err
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in out
    assert "preset" not in out
