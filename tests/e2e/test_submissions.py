"""Submissions beside declarations, through the CLI and the SDK, on the local fleet with a
real agent: `apply -f` touches only its files' runs, a directory apply keeps what was
submitted (and says so) until `dstack delete`, `--prune` or `destroy`, and `dstack stop` ends a
submitted run without forgetting it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status

pytestmark = pytest.mark.timeout(300)

SLEEPER = """\
type: task
name: {name}
commands: ["sleep 600"]
resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}
stop_duration: 1s
"""


def _write(project: Path, name: str) -> Path:
    path = project / f"{name}.dstack.yml"
    path.write_text(SLEEPER.format(name=name))
    return path


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_apply_f_leaves_the_other_runs_alone(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    a, b = _write(project, "ra"), _write(project, "rb")
    _ok(dstack("apply", "-y", "-f", str(b)))
    wait_for_status(dstack, "task.rb", {"running"})

    planned = _ok(dstack("plan", "-f", str(a), "--json"))
    changes = {c["address"]: c["change"]["actions"] for c in json.loads(planned.stdout)[
        "resource_changes"]}  # fmt: skip
    assert changes == {"task.ra": ["create"]}  # rb: not planned to be destroyed
    _ok(dstack("apply", "-y", "-f", str(a)))
    wait_for_status(dstack, "task.ra", {"running"})
    assert wait_for_status(dstack, "task.rb", {"running"})  # still running
    recorded = state(project)["resources"]
    assert recorded["task.ra"]["submitted"] and recorded["task.rb"]["submitted"]

    # both are in the directory's files: the directory apply declares them
    declared = _ok(dstack("apply", "-y"))
    assert "2 submitted resources now declared" in declared.stdout
    assert not any("submitted" in r for r in state(project)["resources"].values())
    # declared now: deleting a file destroys its run, as Terraform does
    a.unlink()
    planned = _ok(dstack("plan"))
    assert "task.ra will be destroyed" in planned.stdout
    assert "not in configuration" in planned.stdout
    _ok(dstack("destroy", "-y"))


def test_sdk_submission_is_kept_by_a_directory_apply(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    _write(project, "declared")
    _ok(dstack("apply", "-y"))
    # a notebook submits a run beside the directory's
    code = (
        "from dstack_plan import submit_task\n"
        "run = submit_task(commands=['sleep 600'], name='notebook', "
        "resources={'cpu': '1..', 'memory': '0.1GB..', 'disk': '1GB..'}, "
        "stop_duration='1s', project='.')\n"
        "print(run.address)\n"
    )
    submitted = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=cli_env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    wait_for_status(dstack, "task.notebook", {"running"})

    applied = _ok(dstack("apply", "-y"))
    assert "1 submitted resource kept (not in the files): task.notebook" in applied.stdout
    assert "dstack delete NAME" in applied.stdout
    assert wait_for_status(dstack, "task.notebook", {"running"})
    as_json = json.loads(_ok(dstack("plan", "--json")).stdout)
    assert as_json["kept_submitted"] == ["task.notebook"]

    # stop ends it and keeps it readable; the directory apply still keeps it
    _ok(dstack("stop", "notebook", "-y"))
    wait_for_status(dstack, "task.notebook", {"terminated", "done", "failed"})
    assert "task.notebook" in state(project)["resources"]
    assert "kept" in _ok(dstack("apply", "-y")).stdout

    # --prune removes it; the declared run is untouched
    pruned = _ok(dstack("apply", "-y", "--prune"))
    assert "task.notebook will be destroyed" in pruned.stdout
    assert set(state(project)["resources"]) == {"task.declared"}
    assert wait_for_status(dstack, "task.declared", {"running"})
    _ok(dstack("destroy", "-y"))


def test_delete_ends_a_submitted_run_and_destroy_ends_everything(
    dstack: Dstack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    one, two = _write(elsewhere, "one"), _write(elsewhere, "two")
    _ok(dstack("apply", "-y", "-f", str(one), "-f", str(two)))
    wait_for_status(dstack, "task.one", {"running"})
    _write(project, "mine")
    _ok(dstack("apply", "-y"))

    missing = dstack("delete", "nosuch", "-y")
    assert missing.returncode == 1 and "no resource 'nosuch' in state" in missing.stderr
    deleted = _ok(dstack("delete", "one", "-y"))
    assert "task.one will be destroyed" in deleted.stdout
    assert set(state(project)["resources"]) == {"task.two", "task.mine"}
    _ok(dstack("delete", "-f", str(two), "-y"))
    assert set(state(project)["resources"]) == {"task.mine"}

    _ok(dstack("apply", "-y", "-f", str(one)))
    destroyed = _ok(dstack("destroy", "-y"))  # submitted and declared alike
    assert "task.one" in destroyed.stdout and "task.mine" in destroyed.stdout
    assert state(project)["resources"] == {}


def test_a_submitted_run_may_name_a_fleet_applied_from_another_file(
    dstack: Dstack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    run = project / "run.dstack.yml"
    run.write_text(SLEEPER.format(name="onlocal") + "fleets: [gone]\n")
    refused = dstack("plan", "-f", str(run))
    assert refused.returncode == 1
    assert "fleet.gone, which is neither in the files given nor in the project's state" in (
        refused.stderr
    )
    assert dstack("apply", "-y", "--prune", "-f", str(run)).returncode == 1
