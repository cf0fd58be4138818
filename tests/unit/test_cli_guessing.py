"""Commands must not guess: missing and empty directories, stray arguments, addresses without
their kind, the local agent's default data dir, and the walk that finds configuration files.

In-process, with no agent: none of these needs one (and plan starts none when nothing runs).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstack_plan.agent.main import main as agent_main
from dstack_plan.cli.app import build_app, invoked_command
from dstack_plan.config import discover as discovery
from dstack_plan.config.discover import discover, parse_pseudo_mounts
from dstack_plan.providers.local import LocalProvider
from dstack_plan.state import LocalBackend, ResourceState, State
from tests.conftest import run_main
from tests.unit.test_cli_state_graph_init import NOW, make_state

TASK = "type: task\nname: count\ncommands: [echo hi]\nresources: {cpu: 1.., memory: 0.1GB..}\n"


@pytest.fixture(autouse=True)
def _own_agent_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "agent"
    monkeypatch.setenv("DSTACK_PLAN_AGENT_DIR", str(path))
    monkeypatch.delenv("DSTACK_STATE", raising=False)
    yield path
    agent_main(["stop", "--data-dir", str(path)])  # none should run; if one does, not for ever


def yes(command: str) -> list[str]:
    """`command`, with -y where it asks for confirmation."""
    return [command] if command == "plan" else [command, "-y"]


# -- directories -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "apply", "destroy"])
def test_a_missing_directory_is_an_error_and_is_not_created(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, *yes(command), "no-such-dir")
    assert (code, out) == (1, "")
    assert err == "Error: no such directory: no-such-dir\n"
    assert not (tmp_path / "no-such-dir").exists()


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_a_directory_without_configuration_is_an_error_and_gets_no_dstack_dir(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = tmp_path / "empty"
    project.mkdir()
    (project / "notes.yml").write_text("type: task\n")  # not a *.dstack.yml file
    code, out, err = run_main(monkeypatch, capsys, *yes(command), str(project))
    assert (code, out) == (1, "")
    assert err == f"Error: no *.dstack.yml files found in {project}\n"
    assert sorted(p.name for p in project.iterdir()) == ["notes.yml"]


def test_an_empty_directory_whose_state_holds_resources_points_at_destroy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_state(tmp_path / ".dstack" / "state.json")
    code, _, err = run_main(monkeypatch, capsys, "plan", str(tmp_path))
    assert code == 1
    assert err == (
        f"Error: no *.dstack.yml files found in {tmp_path} (the state at "
        f"{tmp_path}/.dstack/state.json holds 4 resource(s); `dstack destroy` removes them)\n"
    )


def test_destroy_in_an_empty_directory_changes_nothing_and_leaves_no_dstack_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(monkeypatch, capsys, "destroy", "-y", str(tmp_path))
    assert code == 0
    assert "No changes." in out
    assert list(tmp_path.iterdir()) == []  # no .dstack/, and no agent was started


def test_an_apply_whose_plan_fails_leaves_no_dstack_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.dstack.yml").write_text("type: task\nname: bad\ncommands: 7\n")
    code, _, err = run_main(monkeypatch, capsys, "apply", "-y", str(tmp_path))
    assert code == 1 and "bad.dstack.yml:3:" in err
    assert not (tmp_path / ".dstack").exists()


def test_an_existing_dstack_dir_is_kept_when_apply_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".dstack").mkdir()
    (tmp_path / "bad.dstack.yml").write_text("type: task\nname: bad\ncommands: 7\n")
    assert run_main(monkeypatch, capsys, "apply", "-y", str(tmp_path))[0] == 1
    assert (tmp_path / ".dstack").is_dir()


# -- run arguments ---------------------------------------------------------------------------


def test_a_second_positional_argument_to_apply_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "foo").mkdir()
    args = ["apply", "-y", "--attach", str(tmp_path / "foo"), "bar"]
    result = CliRunner().invoke(build_app(only=invoked_command(args)), args)
    assert result.exit_code == 1, result.output
    assert "unexpected argument 'bar'" in result.output
    assert "arguments for the run go after `--`" in result.output
    assert not (tmp_path / "foo" / ".dstack").exists()


# -- --target without a kind -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "apply", "destroy"])
def test_a_target_without_its_kind_suggests_the_address(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "count.dstack.yml").write_text(TASK)
    if command == "destroy":  # destroy looks in state: put the task there
        backend = LocalBackend(tmp_path / ".dstack" / "state.json")
        entry = ResourceState.create(
            "task.count", provider="local", spec={}, status="done", now=NOW
        )
        backend.write(State.empty().with_resource(entry), backend.read().version)
    code, _, err = run_main(monkeypatch, capsys, *yes(command), str(tmp_path), "--target", "count")
    assert code == 1
    assert err == (
        "Error: --target count: no such resource in configuration or state; "
        "did you mean task.count?\n"
    )


def test_a_mistyped_address_suggests_the_close_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "count.dstack.yml").write_text(TASK)
    _, _, err = run_main(monkeypatch, capsys, "plan", str(tmp_path), "--replace", "task.cuont")
    assert err.endswith("; did you mean task.count?\n")


# -- version, ps, state ------------------------------------------------------------------------


def test_version_is_the_package_version(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib.metadata import version

    assert run_main(monkeypatch, capsys, "--version") == (
        0,
        f"dstack-plan {version('dstack-plan')}\n",
        "",
    )


def test_ps_all_with_no_runs_does_not_suggest_ps_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(monkeypatch, capsys, "ps", "-a", str(tmp_path)) == (0, "No runs.\n", "")
    _, out, _ = run_main(monkeypatch, capsys, "ps", str(tmp_path))
    assert out == "No runs. (dstack ps -a shows finished ones too.)\n"


def test_state_list_and_show_have_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "state.json")
    make_state(Path(path))
    _, out, _ = run_main(monkeypatch, capsys, "state", "list", "--json", "--state", path)
    listed = json.loads(out)
    assert [e["address"] for e in listed] == [
        "fleet.pool",
        "task.eval",
        "task.train",
        "volume.data",
    ]
    assert listed[2] == {
        "address": "task.train",
        "kind": "task",
        "name": "train",
        "provider": "local",
        "status": "done",
        "tainted": False,
    }
    _, out, _ = run_main(monkeypatch, capsys, "state", "show", "task.train", "--state", path)
    header, *lines = out.splitlines()
    assert header == "# task.train:"
    fields = dict(line.split(" = ", 1) for line in lines)
    assert {k.rstrip(): v for k, v in fields.items()}.items() >= {
        "status": '"done"',
        "depends_on": '["fleet.pool", "volume.data"]',
        "spec.name": '"train"',
    }.items()
    assert len({line.index(" = ") for line in lines}) == 1  # values line up
    _, out, _ = run_main(
        monkeypatch, capsys, "state", "show", "task.train", "--json", "--state", path
    )
    shown = json.loads(out)
    assert (shown["address"], shown["status"]) == ("task.train", "done")


# -- the local agent ---------------------------------------------------------------------------


def test_agent_commands_default_to_the_local_agents_data_dir(
    _own_agent_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent_main(["status"]) == 3  # not running
    assert json.loads(capsys.readouterr().out) == {
        "data_dir": str(_own_agent_dir),
        "running": False,
    }


def test_the_local_agent_is_not_started_to_learn_that_nothing_runs(
    _own_agent_dir: Path,
) -> None:
    async def ask() -> tuple[int, int, bool]:
        provider = LocalProvider()
        [machine] = await provider.refresh(provider.implicit_instances("local"))
        agent = await provider.agent(machine)
        jobs = await agent.list_jobs()
        assert machine.resources is not None
        with pytest.raises(Exception, match="no job with id 'x'") as error:
            await agent.get_job("x")
        assert getattr(error.value, "status", None) == 404
        await provider.close()
        return len(jobs), machine.resources.cpus, provider.started is None

    jobs, cpus, none_started = asyncio.run(ask())
    assert (jobs, none_started) == (0, True)
    assert cpus >= 1
    assert not _own_agent_dir.exists()


def test_plan_starts_no_agent_when_none_has_jobs(
    tmp_path: Path,
    _own_agent_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "count.dstack.yml").write_text(TASK)
    code, out, err = run_main(monkeypatch, capsys, "plan", str(tmp_path))
    assert code == 0, err
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in out
    assert err == ""
    assert not _own_agent_dir.exists()
    assert not (tmp_path / ".dstack").exists()


# -- finding configuration files ---------------------------------------------------------------


def test_the_walk_never_enters_proc(capsys: pytest.CaptureFixture[str]) -> None:
    # before: PermissionError on proc/1/fdinfo/pyvenv.cfg, as root too
    assert discover(Path("/proc")) == []
    assert capsys.readouterr().err == ""


def test_pseudo_file_system_mounts_are_read_from_the_mount_table() -> None:
    table = (
        "proc /proc proc rw,nosuid 0 0\n"
        "sysfs /sys sysfs ro 0 0\n"
        "cgroup /sys/fs/cgroup/cpu cgroup ro 0 0\n"
        "tmpfs /tmp tmpfs rw 0 0\n"
        "/dev/sda1 /work ext4 rw 0 0\n"
        "proc /mnt/with\\040space proc rw 0 0\n"
    )
    assert parse_pseudo_mounts(table) == {
        "/proc",
        "/sys",
        "/sys/fs/cgroup/cpu",
        "/mnt/with space",
    }


def test_the_walk_skips_mount_points_of_pseudo_file_systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "x.dstack.yml").write_text(TASK)
    (tmp_path / "ram").mkdir()
    (tmp_path / "ram" / "y.dstack.yml").write_text(TASK)
    table = tmp_path / "mounts"
    table.write_text(f"proc {tmp_path}/kernel proc rw 0 0\ntmpfs {tmp_path}/ram tmpfs rw 0 0\n")
    monkeypatch.setattr(discovery, "MOUNTS_FILE", str(table))
    assert discover(tmp_path) == [tmp_path / "ram" / "y.dstack.yml"]


def test_the_walk_does_not_follow_symlinked_directories_into_loops(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.dstack.yml").write_text(TASK)
    (tmp_path / "a" / "loop").symlink_to(tmp_path)
    (tmp_path / "linked.dstack.yml").symlink_to(tmp_path / "a" / "x.dstack.yml")
    assert discover(tmp_path) == [tmp_path / "linked.dstack.yml", tmp_path / "a" / "x.dstack.yml"]


def test_graph_has_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.dstack.yml").write_text(
        f"{TASK}---\ntype: task\nname: after\ndepends_on: [task.count]\ncommands: [echo]\n"
    )
    code, out, _ = run_main(monkeypatch, capsys, "graph", "--json", str(tmp_path))
    assert code == 0
    graph = json.loads(out)
    assert [(n["address"], n["depends_on"]) for n in graph["nodes"]] == [
        ("task.after", ["task.count"]),
        ("task.count", []),
    ]
    assert graph["edges"] == [{"from": "task.after", "to": "task.count"}]
