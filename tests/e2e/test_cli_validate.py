"""`dstack validate` and `dstack schema` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

DSTACK = [sys.executable, "-m", "dstack_plan.cli"]


def run(
    *args: str, cwd: Path = REPO_ROOT, stdin: str | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [*DSTACK, *args], cwd=cwd, capture_output=True, text=True, input=stdin, env=env, timeout=60
    )


def test_validate_examples() -> None:
    result = run("validate", "examples/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("resources OK")


def test_validate_reports_errors_with_locations_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "bad.dstack.yml").write_text("type: task\ncomands: [x]\nmax_duration: soon\n")
    result = run("validate", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "bad.dstack.yml:2:1: error: unknown key 'comands' (did you mean 'commands'?)",
        "bad.dstack.yml:3:15: error: max_duration: invalid duration 'soon': expected seconds or "
        "a number with unit s, m, h, d or w (e.g. 90s, 2h), or off",
    ]
    assert "Traceback" not in result.stderr


def test_validate_json(tmp_path: Path) -> None:
    (tmp_path / "ok.dstack.yml").write_text("type: task\nname: ok\ncommands: [x]\n")
    good = json.loads(run("validate", "--json", str(tmp_path)).stdout)
    assert good == {
        "valid": True,
        "resources": [
            {"address": "task.ok", "kind": "task", "name": "ok", "file": "ok.dstack.yml"}
        ],
        "presets": [],
        "policies": [],
        "errors": [],
        "warnings": [],
    }
    (tmp_path / "bad.dstack.yml").write_text("type: fleet\nnodes: x\n")
    result = run("validate", "--json", str(tmp_path))
    assert result.returncode == 1
    bad = json.loads(result.stdout)
    assert bad["valid"] is False
    assert bad["errors"][0]["file"] == "bad.dstack.yml"
    assert (bad["errors"][0]["line"], bad["errors"][0]["column"]) == (2, 8)


def test_validate_files_and_stdin(tmp_path: Path) -> None:
    f = tmp_path / "t.dstack.yml"
    f.write_text("type: task\nname: one\ncommands: [x]\n")
    assert run("validate", "-f", str(f)).stdout.strip() == "1 resource OK"
    piped = run("validate", "-f", "-", stdin="type: task\nname: two\ncommands: [x]\n")
    assert piped.stdout.strip() == "1 resource OK"
    broken = run("validate", "-f", "-", stdin="type: task\n  bad: [\n")
    assert broken.returncode == 1 and broken.stderr.startswith("<stdin>:")


def test_a_file_alone_may_name_what_the_project_s_state_holds_or_another_project(
    tmp_path: Path,
) -> None:
    """`validate -f` of one run file (as dstack's docs show them) naming a fleet the files do
    not declare, and another project's fleets and gateway: each a warning (never an error)
    while the project's state lacks it or `.dstack/projects.yml` cannot resolve it, silence
    once the state holds it and the owner's state exports the others to this project."""
    from dstack_plan.state.exports import Export, Importer
    from dstack_plan.state.local import LocalBackend
    from dstack_plan.state.model import ResourceState, State

    project = tmp_path / "ml"
    project.mkdir()
    run_file = project / "train.dstack.yml"
    run_file.write_text(
        "type: task\nname: train\ncommands: [x]\n"
        "fleets: [gpu, team/a100, {project: team, name: h100}]\n"
    )
    (project / "api.dstack.yml").write_text(
        "type: service\nname: api\nport: 80\ncommands: [x]\ngateway: team/gw\n"
    )
    files = ["-f", str(run_file), "-f", str(project / "api.dstack.yml")]
    warned = run("validate", *files, cwd=project)
    assert warned.returncode == 0, warned.stderr
    assert warned.stdout.strip() == "2 resources OK"
    unknown = "project 'team' is not in .dstack/projects.yml (projects: none)"
    lines = warned.stderr.splitlines()
    assert lines[0] == (
        "train.dstack.yml:4:1: warning: task.train refers to fleet.gpu, which neither the files "
        "nor the project's state hold: plan resolves it where the run is applied"
    )
    assert [line.split(" add it")[0] for line in lines[1:]] == [
        f"train.dstack.yml:4:15: warning: fleet team/a100: {unknown}:",
        f"train.dstack.yml:4:26: warning: fleet team/h100: {unknown}:",
        f"api.dstack.yml:5:1: warning: gateway team/gw: {unknown}:",
    ]
    as_json = json.loads(run("validate", "--json", *files, cwd=project).stdout)
    assert as_json["valid"] is True and len(as_json["warnings"]) == 4

    def entry(kind: str, name: str) -> ResourceState:
        return ResourceState.model_validate(
            {"kind": kind, "name": name, "provider": "ssh",
             "spec": {"type": kind, "name": name}, "status": "running",
             "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}
        )  # fmt: skip

    backend = LocalBackend(project / ".dstack" / "state.json")
    backend.write(State.empty().with_resource(entry("fleet", "gpu")), backend.read().version)
    team = LocalBackend(tmp_path / "team" / "state.json")
    owned = State.empty()
    for kind, name in (("fleet", "a100"), ("fleet", "h100"), ("gateway", "gw")):
        owned = owned.with_resource(entry(kind, name))
    team.write(owned, team.read().version)
    (project / ".dstack" / "projects.yml").write_text(
        f"projects:\n  team: {{state: {tmp_path}/team/state.json}}\n"
    )
    not_shared = run("validate", *files, cwd=project)
    assert not_shared.returncode == 0
    assert "fleet 'a100' of project 'team' is not exported to project 'ml'" in not_shared.stderr
    assert "gateway 'gw' of project 'team' is not exported to project 'ml'" in not_shared.stderr

    share = Export(
        name="share", fleets=("a100", "h100"), gateways=("gw",),
        importers=(Importer(project="ml", state=str(backend.path)),),
    )  # fmt: skip
    shared = owned.model_copy(update={"exports": {"share": share}})
    team.write(shared, team.read().version)
    quiet = run("validate", *files, cwd=project)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # a directory is a whole project: there, a fleet it does not declare is an error
    assert run("validate", str(project), cwd=project).returncode == 1


TASK = "type: task\nname: train\ncommands: [python train.py]\n"


def test_validate_checks_the_projects_policies_and_those_given(tmp_path: Path) -> None:
    (tmp_path / "train.dstack.yml").write_text(TASK)
    policies = tmp_path / ".dstack" / "policies"
    policies.mkdir(parents=True)
    for name in ("max-gpus.yml", "protect-volumes.yml"):
        (policies / name).write_text((REPO_ROOT / "examples" / "policies" / name).read_text())
    result = run("validate", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1 resource and 2 policy rules OK\n"

    # a rule naming a field the plan does not have, and a syntax error, in a file given:
    # both located, with the configuration's own error beside them, exit 1
    (tmp_path / "gate.yml").write_text(
        "rules:\n"
        "  - name: typo\n"
        '    expression: "runs.all(r, r.gpuz <= 8)"\n'
        "    message: too many GPUs\n"
        "  - name: broken\n"
        '    expression: "runs.all(r, r.gpus <= )"\n'
        "    message: never\n"
    )
    (tmp_path / "bad.dstack.yml").write_text("type: task\ncomands: [x]\n")
    result = run("validate", ".", "--policy", "gate.yml", "--json", cwd=tmp_path)
    assert result.returncode == 1
    errors = json.loads(result.stdout)["errors"]
    where = [(e["file"], e["line"]) for e in errors]
    assert where == [("bad.dstack.yml", 2), ("gate.yml", 3), ("gate.yml", 6)], errors
    assert "no field 'gpuz'" in errors[1]["message"]
    assert errors[2]["message"].startswith("rule 'broken': syntax error")

    (tmp_path / "bad.dstack.yml").unlink()
    (tmp_path / "gate.yml").write_text(
        "rules:\n  - name: cheap\n    expression: cost.after < 10.0\n"
        "    message: over budget\n    severity: warn\n"
    )
    result = run("validate", ".", "--policy", "gate.yml", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    checked = json.loads(result.stdout)["policies"]
    assert {(p["name"], p["file"], p["severity"]) for p in checked} == {
        ("max-gpus", ".dstack/policies/max-gpus.yml", "deny"),
        ("protect-volumes", ".dstack/policies/protect-volumes.yml", "deny"),
        ("cheap", "gate.yml", "warn"),
    }


def test_schema_unknown_kind_is_a_clean_error() -> None:
    result = run("schema", "pipeline")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: unknown kind 'pipeline'")
    assert "Traceback" not in result.stderr
