"""`dstack init`, `dstack graph` and `dstack state ...` on real files, in-process (fast)."""

from __future__ import annotations

import json
import stat
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstack_plan.cli.app import app
from dstack_plan.clock import SystemClock
from dstack_plan.errors import LockError, StateError
from dstack_plan.inspect.workspace import init_workspace
from dstack_plan.state import LocalBackend, LockInfo, ResourceState, State
from tests.conftest import run_main

NOW = datetime(2025, 1, 2, tzinfo=timezone.utc)

PROJECT = """\
type: fleet
name: pool
ssh_config:
  user: root
  hosts: [10.0.0.1]
---
type: volume
name: data
backend: aws
region: us-east-1
size: 10GB
---
type: task
name: train
fleets: [pool]
volumes:
  - name: data
    path: /data
commands: [python train.py]
---
type: task
name: eval
depends_on: [task.train]
commands: [python eval.py]
"""

DOT = """\
digraph dstack {
  rankdir = LR;
  "fleet.pool";
  "task.eval";
  "task.train";
  "volume.data";
  "task.train" -> "fleet.pool";
  "task.eval" -> "task.train";
  "task.train" -> "volume.data";
}
"""


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"NO_COLOR": "1"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout


def make_state(path: Path) -> LocalBackend:
    backend = LocalBackend(path)
    state = State.empty()
    for address, deps in [
        ("fleet.pool", ()),
        ("volume.data", ()),
        ("task.train", ("fleet.pool", "volume.data")),
        ("task.eval", ("task.train",)),
    ]:
        state = state.with_resource(
            ResourceState.create(
                address,
                provider="local",
                spec={"name": address.split(".")[1]},
                status="done",
                now=NOW,
                attributes={"jobs": []},
                depends_on=deps,
            )
        )
    backend.write(state, backend.read().version)
    return backend


# -- init ----------------------------------------------------------------------------------


def test_init_creates_private_dir_and_gitignore_idempotently(tmp_path: Path) -> None:
    code, out = invoke("init", str(tmp_path))
    assert code == 0
    assert out.splitlines() == [
        "Created .dstack/ (mode 0700).",
        "Added .dstack/* to .gitignore (but backend.yml, backends.yml, quotas.yml, policies/).",
    ]
    assert stat.S_IMODE((tmp_path / ".dstack").stat().st_mode) == 0o700
    first = (tmp_path / ".gitignore").read_text()
    assert [
        ".dstack/*", "!.dstack/backend.yml", "!.dstack/backends.yml", "!.dstack/quotas.yml",
        "!.dstack/policies/",
    ] == first.splitlines()[1:]  # fmt: skip

    code, out = invoke("init", str(tmp_path))
    assert (code, out) == (0, "Already initialised: nothing to do.\n")
    assert (tmp_path / ".gitignore").read_text() == first


def test_init_appends_to_an_existing_gitignore_once(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.pyc\n.venv/")  # no trailing newline
    assert init_workspace(tmp_path)[-1].startswith("added .dstack/* to .gitignore")
    lines = (tmp_path / ".gitignore").read_text().splitlines()
    assert lines[:2] == ["*.pyc", ".venv/"]
    assert lines.count(".dstack/*") == 1
    assert init_workspace(tmp_path) == []
    assert (tmp_path / ".gitignore").read_text().splitlines() == lines


def test_git_ignores_the_state_and_secrets_but_not_the_backend_and_quotas(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    init_workspace(tmp_path)
    names = ["state.json", "state.json.backup", "secrets.yml", "backend.yml", "quotas.yml"]
    names.append("policies/limits.yml")
    checked = subprocess.run(
        ["git", "check-ignore", *(f".dstack/{n}" for n in names)],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    ignored = set(checked.stdout.split())
    assert ignored == {".dstack/state.json", ".dstack/state.json.backup", ".dstack/secrets.yml"}


def test_init_respects_an_existing_ignore_and_tightens_permissions(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("/.dstack\n")
    (tmp_path / ".dstack").mkdir(mode=0o755)
    (tmp_path / ".dstack").chmod(0o755)
    assert init_workspace(tmp_path) == ["made .dstack/ private (mode 0700)"]
    assert (tmp_path / ".gitignore").read_text() == "/.dstack\n"
    assert stat.S_IMODE((tmp_path / ".dstack").stat().st_mode) == 0o700


def test_init_of_a_missing_directory_is_a_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(monkeypatch, capsys, "init", str(tmp_path / "nope"))
    assert code == 1
    assert err == f"Error: {tmp_path / 'nope'}: not a directory\n"


# -- graph ---------------------------------------------------------------------------------


def test_graph_from_configuration(tmp_path: Path) -> None:
    (tmp_path / "app.dstack.yml").write_text(PROJECT)
    assert invoke("graph", str(tmp_path)) == (0, DOT)


def test_graph_from_state_when_the_configuration_is_gone(tmp_path: Path) -> None:
    make_state(tmp_path / ".dstack" / "state.json")
    # the same picture (DOT shows the transitive reduction: eval -> fleet.pool is implied)
    assert invoke("graph", str(tmp_path)) == (0, DOT)
    # but state edges differ from the config's on purpose: eval records only its own one
    code, out = invoke("graph", "--json", str(tmp_path))
    nodes = {node["address"]: node for node in json.loads(out)["nodes"]}
    assert nodes["task.eval"]["depends_on"] == ["task.train"]
    assert nodes["task.train"]["provider"] == "local"


def test_graph_of_an_empty_project(tmp_path: Path) -> None:
    assert invoke("graph", str(tmp_path)) == (0, "digraph dstack {\n  rankdir = LR;\n}\n")


def test_graph_reports_configuration_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.dstack.yml").write_text("type: task\nname: aa\nfleets: [nope]\ncommands: [x]\n")
    code, out, err = run_main(monkeypatch, capsys, "graph", str(tmp_path))
    assert (code, out) == (1, "")
    assert "task.aa refers to fleet.nope, which is not declared" in err


# -- state ---------------------------------------------------------------------------------


def test_state_list_show_and_pull(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    make_state(path)
    code, out = invoke("state", "list", "--state", str(path))
    assert (code, out.splitlines()) == (
        0,
        ["fleet.pool", "task.eval", "task.train", "volume.data"],
    )

    code, out = invoke("state", "show", "task.train", "--json", "--state", str(path))
    shown = json.loads(out)
    assert code == 0
    assert shown["address"] == "task.train"
    assert shown["depends_on"] == ["fleet.pool", "volume.data"]
    assert shown["status"] == "done"

    assert invoke("state", "pull", "--state", str(path)) == (0, path.read_text())


def test_state_commands_on_a_missing_state(tmp_path: Path) -> None:
    path = str(tmp_path / "none.json")
    assert invoke("state", "list", "--state", path) == (0, "")
    assert invoke("state", "pull", "--state", path) == (0, "")
    assert not (tmp_path / "none.json").exists()


def test_state_show_unknown_address_is_a_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "state.json"
    make_state(path)
    code, out, err = run_main(
        monkeypatch, capsys, "state", "show", "task.nope", "--state", str(path)
    )
    assert (code, out) == (1, "")
    assert err == (
        f"Error: no resource 'task.nope' in the state at {path} "
        "(known: fleet.pool, task.eval, task.train, volume.data)\n"
    )


def test_state_rm_forgets_resources_with_one_commit(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = make_state(path)
    before = backend.read().state
    code, out = invoke("state", "rm", "task.eval", "task.train", "--state", str(path))
    assert code == 0
    assert out.splitlines() == [
        "Removed task.eval",
        "Removed task.train",
        "Successfully removed 2 resource(s) from the state.",
    ]
    after = backend.read().state
    assert after.addresses == ["fleet.pool", "volume.data"]
    assert (after.lineage, after.serial) == (before.lineage, before.serial + 1)
    assert after.get("fleet.pool") == before.get("fleet.pool")
    assert backend.read_lock_info() is None  # the operation lock was released


def test_state_rm_of_an_unknown_address_removes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = make_state(path)
    before = backend.read()
    with pytest.raises(StateError, match="no resource 'task.nope'"):
        invoke("state", "rm", "task.eval", "task.nope", "--state", str(path))
    assert backend.read() == before


def test_state_rm_waits_for_no_one_while_an_apply_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = make_state(path)
    holder = backend.try_lock("apply", "someone@host", 60, SystemClock())
    try:
        with pytest.raises(LockError, match="is locked by another operation"):
            invoke("state", "rm", "task.eval", "--state", str(path))
    finally:
        holder.release()
    assert "task.eval" in backend.read().state.resources


def test_state_unlock_removes_a_stale_lock_with_the_right_id(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = make_state(path)
    # a record nobody holds a flock on: what a killed apply leaves behind
    stale = LockInfo.new(
        operation="apply", who="ci@runner", path=str(path), ttl=60, clock=SystemClock(), pid=1
    )
    backend.lock_info_path.write_text(stale.to_json())
    with pytest.raises(LockError, match="does not match"):
        invoke("state", "unlock", "wrong-id", "--state", str(path))
    code, out = invoke("state", "unlock", stale.id, "--state", str(path))
    assert (code, out) == (0, f"Released the state lock {stale.id} on {path}.\n")
    assert not backend.lock_info_path.exists()


def test_state_unlock_when_not_locked(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    make_state(path)
    with pytest.raises(LockError, match="is not locked"):
        invoke("state", "unlock", "any", "--state", str(path))


def test_state_path_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "elsewhere.json"
    make_state(path)
    monkeypatch.setenv("DSTACK_STATE", str(path))
    code, out = invoke("state", "list")
    assert (code, len(out.splitlines())) == (0, 4)
