"""`dstack validate` checks everything `plan` checks without state or agents, as plan does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from dstack_plan.errors import ConfigError
from dstack_plan.graph.cycles import find_cycles, starting_at
from dstack_plan.project import Project
from tests.conftest import REPO_ROOT, run_main


def plan_errors(directory: Path) -> list[str]:
    """The configuration errors `plan` stops at (its desired side, before any refresh)."""
    with pytest.raises(ConfigError) as info:
        Project(directory, state_path=directory / "state.json").desired_items()
    return [str(i) for i in info.value.issues]


BROKEN_PROJECT = {
    "runs.dstack.yml": """\
type: task
name: prep
commands: [x]
fleets: [nope]
depends_on: [task.train]
---
type: task
name: train
commands: [x]
depends_on: [task.eval, task.prep]
---
type: task
name: eval
commands: [x]
volumes: [missing:/data]
depends_on: [task.train]
""",
    "svc.dstack.yml": """\
type: service
name: llm
commands: [x]
port: 80
gateway: gw
""",
}

# prep, train and eval are one tangle: one cycle of it is named; fixing it shows the next
EXPECTED = [
    "runs.dstack.yml:4:1: error: task.prep refers to fleet.nope, which is not declared",
    "runs.dstack.yml:5:14: error: dependency cycle: task.prep -> task.train -> task.prep",
    "runs.dstack.yml:15:1: error: task.eval refers to volume.missing, which is not declared",
    "svc.dstack.yml:5:1: error: service.llm refers to gateway.gw, which is not declared",
]


def write(directory: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_validate_reports_references_and_cycles_at_once_located(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, BROKEN_PROJECT)
    code, out, err = run_main(monkeypatch, capsys, "validate", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.splitlines() == EXPECTED
    assert "Traceback" not in err


def test_validate_and_plan_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    write(tmp_path, BROKEN_PROJECT)
    _, _, err = run_main(monkeypatch, capsys, "validate", str(tmp_path))
    assert err.splitlines() == plan_errors(tmp_path) == EXPECTED


def test_validate_json_lists_reference_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, {"svc.dstack.yml": BROKEN_PROJECT["svc.dstack.yml"]})
    code, out, _ = run_main(monkeypatch, capsys, "validate", "--json", str(tmp_path))
    assert code == 1
    assert json.loads(out) == {
        "valid": False,
        "resources": [],
        "presets": [],
        "policies": [],
        "errors": [
            {
                "file": "svc.dstack.yml",
                "line": 5,
                "column": 1,
                "message": "service.llm refers to gateway.gw, which is not declared",
            }
        ],
    }


def test_a_cycle_through_an_implied_edge_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the task uses every declared fleet; the fleet waits for the task: a loop
    write(
        tmp_path,
        {
            "a.dstack.yml": "type: fleet\nname: pool\nnodes: 1\ndepends_on: [task.train]\n"
            "---\ntype: task\nname: train\ncommands: [x]\n"
        },
    )
    code, _, err = run_main(monkeypatch, capsys, "validate", str(tmp_path))
    assert code == 1
    assert err.splitlines() == [
        "a.dstack.yml:4:14: error: dependency cycle: fleet.pool -> task.train -> fleet.pool"
    ]


def test_model_checks_are_reported_by_validate_and_plan_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        {
            "t.dstack.yml": "type: task\nname: tt\ncommands: [x]\n"
            "volumes: ['/a:/b:/c:/d']\nresources: {disk: {size: 0}}\n"
            "lifecycle: {ignore_changes: [replicas]}\n"
        },
    )
    code, _, err = run_main(monkeypatch, capsys, "validate", str(tmp_path))
    assert code == 1
    assert err.splitlines() == [
        "t.dstack.yml:4:11: error: volumes.0: invalid volume '/a:/b:/c:/d': "
        "expected NAME:/path or /host/path:/path (one ':', not 3)",
        "t.dstack.yml:5:26: error: resources.disk.size: disk size must be greater than 0GB",
        "t.dstack.yml:6:30: error: lifecycle.ignore_changes.0: a task has no field 'replicas' "
        "(did you mean 'repos'?)",
    ]
    with pytest.raises(ConfigError) as info:
        Project(tmp_path, state_path=tmp_path / "state.json").desired_items()
    assert [str(i) for i in info.value.issues] == err.splitlines()


def test_a_valid_project_still_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        {
            "a.dstack.yml": "type: fleet\nname: pool\nnodes: 1\n---\n"
            "type: task\nname: prep\ncommands: [x]\n---\n"
            "type: task\nname: train\ncommands: [x]\ndepends_on: [task.prep]\n"
        },
    )
    assert run_main(monkeypatch, capsys, "validate", str(tmp_path))[:2] == (0, "3 resources OK\n")


def test_find_cycles_reports_each_disjoint_cycle_once() -> None:
    edges = {"a": ["b"], "b": ["a"], "c": ["d"], "d": ["e"], "e": ["c"], "f": ["a"]}
    cycles = find_cycles(edges)
    assert sorted(sorted(c[:-1]) for c in cycles) == [["a", "b"], ["c", "d", "e"]]
    for cycle in cycles:
        assert cycle[0] == cycle[-1]
        assert all(b in edges[a] for a, b in zip(cycle, cycle[1:], strict=False))
    assert find_cycles({"a": ["b"], "b": []}) == []
    assert starting_at(["c", "d", "e", "c"], "e") == ["e", "c", "d", "e"]


# --- README ---------------------------------------------------------------------------------


def test_readme_count_for_validate_examples_is_what_it_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    claimed = re.search(r"\$ dstack validate examples/\n(\d+) resources? OK\n", readme)
    assert claimed, "the README shows `dstack validate examples/` and its output"
    monkeypatch.chdir(REPO_ROOT)
    code, out, _ = run_main(monkeypatch, capsys, "validate", "examples/")
    assert code == 0
    assert out == f"{claimed.group(1)} resources OK\n"
    assert int(claimed.group(1)) == len(load_project(REPO_ROOT / "examples"))


def test_specs_stored_before_the_stricter_checks_stay_readable() -> None:
    # state written by an older version may hold what the config checks now refuse; destroy
    # still needs to read it back
    from dstack_plan.plan.normalize import spec_from_normalized

    task = {"type": "task", "name": "tt", "commands": ["x"]}
    stored = {
        **task,
        "resources": {"disk": "0GB", "memory": "0GB"},
        "lifecycle": {"ignore_changes": ["bogus.path"]},
    }
    spec = spec_from_normalized("task", stored)
    assert spec.model_dump(mode="json")["resources"]["disk"] == "0GB"
    volume = {"type": "volume", "name": "vv", "backend": "local", "size": "0GB"}
    assert spec_from_normalized("volume", volume).model_dump(mode="json")["size"] == "0GB"
    with pytest.raises(ValueError):  # a config with the same content is refused
        from dstack_plan.config.runs import TaskSpec

        TaskSpec.model_validate(stored)
