"""`dstack plan --policy` and the project's `.dstack/policies/` through the CLI on the local
fleet (a real agent seeing sixteen fake GPUs): the shipped examples, exit codes under
`--detailed-exitcode`, the JSON plan's `policy` section, located errors, and saved plans
checked again when applied."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from dstack_plan.state.model import ResourceState, State
from tests.e2e.conftest import Dstack, fake_nvidia_smi, gpu_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"
GPUS = 16
FAKE_NVIDIA_SMI = '#!/bin/sh\n# Sixteen fake GPUs, for planning.\ncase "$*" in\n' + (
    "  *memory.total,uuid*)\n"
    + "".join(f'    echo "{i}, NVIDIA Fake A100, 81920, GPU-fake-{i}"\n' for i in range(GPUS))
    + "    ;;\n"
    + "  *utilization.gpu*)\n"
    + "".join(f'    echo "{i}, 0, 1024, 81920"\n' for i in range(GPUS))
    + "    ;;\n  *) exit 2 ;;\nesac\n"
)


def task(gpus: int = 0, image: str | None = None, name: str = "train") -> str:
    line = f"image: {image}\n" if image else ""
    return (
        f"type: task\nname: {name}\n{line}commands: ['echo hi']\n"
        f"resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: {gpus}}}\n"
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return tmp_path / "project"


@pytest.fixture
def cli(cli_env: dict[str, str], project: Path, tmp_path: Path) -> Dstack:
    return gpu_cli(cli_env, project, fake_nvidia_smi(tmp_path / "bin", FAKE_NVIDIA_SMI))


def use(project: Path, *examples: str) -> None:
    folder = project / ".dstack" / "policies"
    folder.mkdir(parents=True, exist_ok=True)
    for name in examples:
        shutil.copy(EXAMPLES / name, folder / name)


def test_max_gpus_denies_whatever_detailed_exitcode_says(cli: Dstack, project: Path) -> None:
    use(project, "max-gpus.yml")
    (project / "train.dstack.yml").write_text(task(gpus=12))
    planned = cli("plan", "--detailed-exitcode")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert "Denied: max-gpus (.dstack/policies/max-gpus.yml): a run asks for more than 8 GPUs" in (
        planned.stdout
    )
    assert "Error: the plan is denied by policy: max-gpus" in planned.stderr
    assert "Traceback" not in planned.stderr
    as_json = cli("plan", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["policy"] == {
        "rules": [
            {
                "name": "max-gpus",
                "file": ".dstack/policies/max-gpus.yml",
                "severity": "deny",
                "outcome": "fail",
                "message": "a run asks for more than 8 GPUs",
            }
        ],
        "denied": True,
    }
    assert "Denied: max-gpus" in as_json.stderr  # stdout is the JSON alone
    applied = cli("apply", "-y")
    assert applied.returncode == 1 and "denied by policy: max-gpus" in applied.stderr
    assert (
        not (project / ".dstack" / "state.json").exists()
        or "task.train" not in (project / ".dstack" / "state.json").read_text()
    )

    (project / "train.dstack.yml").write_text(task(gpus=8))
    planned = cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert "Policy: 1 rule checked, 0 denied, 0 warnings." in planned.stdout


def test_a_failed_warn_rule_is_printed_and_keeps_the_exit_code(cli: Dstack, project: Path) -> None:
    (project / "train.dstack.yml").write_text(task(gpus=4))
    warn = project / "warn.yml"
    warn.write_text(
        "rules:\n  - name: few-gpus\n    expression: gpus.total <= 2.0\n"
        "    message: more than 2 GPUs in this plan\n    severity: warn\n"
    )
    planned = cli("plan", "--detailed-exitcode", "--policy", "warn.yml")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert "Warning: few-gpus (warn.yml): more than 2 GPUs in this plan" in planned.stdout
    assert "Policy: 1 rule checked, 0 denied, 1 warning." in planned.stdout
    assert cli("plan", "--policy", "warn.yml").returncode == 0


def test_allowed_registries(cli: Dstack, project: Path) -> None:
    use(project, "allowed-registries.yml")
    (project / "a.dstack.yml").write_text(task(image="quay.io/org/trainer:1"))
    planned = cli("plan")
    assert planned.returncode == 1
    assert "Denied: allowed-registries" in planned.stdout
    for image in ("ubuntu:22.04", "ghcr.io/org/x:1", "nvcr.io/nvidia/pytorch:24.01-py3"):
        (project / "a.dstack.yml").write_text(task(image=image))
        assert cli("plan").returncode == 0, image
    (project / "a.dstack.yml").write_text(task())  # no image: a host process
    assert cli("plan").returncode == 0


def test_max_cost(cli: Dstack, project: Path) -> None:
    (project / "a.dstack.yml").write_text(task(gpus=1))
    example = EXAMPLES / "max-cost.yml"
    planned = cli("plan", "--detailed-exitcode", "--policy", str(example))
    assert planned.returncode == 2, planned.stdout + planned.stderr  # the local fleet is free
    strict = project / "max-cost.yml"
    strict.write_text(example.read_text().replace("cost.after <= 50.0", "cost.after < 0.0"))
    planned = cli("plan", "--policy", "max-cost.yml")
    assert planned.returncode == 1
    assert "Denied: max-cost (max-cost.yml): the hourly cost after apply" in planned.stdout


def test_protect_volumes_denies_destroying_a_volume_in_state(cli: Dstack, project: Path) -> None:
    use(project, "protect-volumes.yml")
    volumes = project.parent / "volumes"
    volumes.mkdir()
    (volumes / "v.dstack.yml").write_text(
        "type: volume\nname: data\nbackend: aws\nregion: us-east-1\nsize: 100GB\n"
    )
    (volume,) = load_project(volumes)
    entry = ResourceState.create(
        "volume.data", provider="aws", spec=volume.normalized, status="created",
        now=datetime(2026, 1, 1, tzinfo=timezone.utc),
    )  # fmt: skip
    (project / ".dstack" / "state.json").write_text(State.empty().with_resource(entry).to_json())
    (project / "a.dstack.yml").write_text(task())
    planned = cli("plan", "--allow-destroy", "volume.data", "--detailed-exitcode")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert "Denied: protect-volumes" in planned.stdout
    assert "the plan destroys or replaces a volume" in planned.stdout
    destroyed = cli("destroy", "-y", "--allow-destroy", "volume.data")  # destroy plans too
    assert destroyed.returncode == 1, destroyed.stdout + destroyed.stderr
    assert "denied by policy: protect-volumes" in destroyed.stderr
    assert "volume.data" in (project / ".dstack" / "state.json").read_text()


def test_a_syntax_error_and_a_missing_field_are_clear_errors(cli: Dstack, project: Path) -> None:
    (project / "a.dstack.yml").write_text(task())
    bad = project / "bad.yml"
    bad.write_text(
        "rules:\n  - name: broken\n    expression: runs.all(r, r.gpus <= )\n    message: m\n"
    )
    planned = cli("plan", "--detailed-exitcode", "--policy", "bad.yml")
    assert planned.returncode == 1
    assert "bad.yml:3:39: error: rule 'broken': syntax error" in planned.stderr
    assert "Traceback" not in planned.stderr
    bad.write_text(
        "rules:\n  - name: typo\n    expression: runs.all(r, r.gpu <= 8)\n    message: m\n"
    )
    planned = cli("plan", "--detailed-exitcode", "--policy", "bad.yml")
    assert planned.returncode == 1
    assert "bad.yml:3:31: error: rule 'typo': r (a run) has no field 'gpu'" in planned.stderr


def test_a_saved_plan_records_the_results_and_apply_checks_again(
    cli: Dstack, project: Path
) -> None:
    (project / "a.dstack.yml").write_text(task(gpus=4))
    ci = project / "ci-policy.yml"
    ci.write_text(
        "rules:\n  - name: gpus\n    expression: gpus.total <= 4.0\n    message: too many GPUs\n"
    )
    planned = cli("plan", "-out", "plan.json", "--policy", "ci-policy.yml")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    saved = json.loads((project / "plan.json").read_text())
    assert saved["policy"]["rules"][0]["outcome"] == "pass"
    assert saved["policy"]["denied"] is False
    # the policy tightens before the saved plan is applied: the file recorded is checked again
    ci.write_text(ci.read_text().replace("<= 4.0", "<= 2.0"))
    applied = cli("apply", "plan.json")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert "Policy rule gpus (ci-policy.yml) was pass when the plan was saved, fail now." in (
        applied.stdout
    )
    assert "denied by policy: gpus" in applied.stderr
    assert (
        not (project / ".dstack" / "state.json").exists()
        or "task.train" not in (project / ".dstack" / "state.json").read_text()
    )
    # a project policy added since also applies to the saved plan
    ci.write_text(ci.read_text().replace("<= 2.0", "<= 4.0"))
    use(project, "max-gpus.yml")
    (project / ".dstack" / "policies" / "max-gpus.yml").write_text(
        (EXAMPLES / "max-gpus.yml").read_text().replace("<= 8", "<= 3")
    )
    applied = cli("apply", "plan.json")
    assert applied.returncode == 1
    assert "denied by policy: max-gpus" in applied.stderr


def test_a_project_without_policies_imports_neither_cel_nor_the_policy_package(
    cli: Dstack, project: Path, cli_env: dict[str, str]
) -> None:
    from tests.e2e.test_cli_imports import imported

    (project / "a.dstack.yml").write_text(task())
    assert cli("plan").returncode == 0
    modules = imported(["plan"], project, cli_env)
    assert "dstack_plan.cli.policy_view" in modules
    assert not any(m == "cel" or m.startswith(("cel.", "dstack_plan.policy")) for m in modules)
    use(project, "max-gpus.yml")
    modules = imported(["plan"], project, cli_env)
    assert "cel" in modules and "dstack_plan.policy.evaluate" in modules


def test_a_saved_plan_whose_policy_file_is_gone_is_refused(cli: Dstack, project: Path) -> None:
    (project / "a.dstack.yml").write_text(task())
    (project / "ci.yml").write_text((EXAMPLES / "max-gpus.yml").read_text())
    assert cli("plan", "-out", "plan.json", "--policy", "ci.yml").returncode == 0
    (project / "ci.yml").unlink()
    applied = cli("apply", "plan.json")
    assert applied.returncode == 1
    assert "ci.yml:1:1: error: cannot read policy file" in applied.stderr
    assert "Traceback" not in applied.stderr
