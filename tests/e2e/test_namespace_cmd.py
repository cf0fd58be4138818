"""`dstack namespace` as a user runs it: it edits `.dstack/quotas.yml` (keeping comments),
refuses bad input with exit 1, and lists limits beside what running runs hold."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack, fake_nvidia_smi, gpu_cli
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_shared_gpu import FAKE_NVIDIA_SMI

QUOTAS = Path(".dstack/quotas.yml")


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_create_limit_set_list_delete(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    created = ok(dstack("namespace", "create", "dev", "--quota", "gpu=20", "--quota",
                        "gpu_hours_per_day=100"))  # fmt: skip
    assert created.stdout == "Created namespace dev (.dstack/quotas.yml)\n"
    path = project / QUOTAS
    path.write_text(path.read_text().replace("gpus: 20", "gpus: 20  # agreed with finance"))
    ok(dstack("namespace", "limit", "dev", "--per-user", "--limit", "gpus=4"))
    ok(dstack("namespace", "limit", "dev", "--user", "alice", "--limit", "gpu_hours_per_day=5"))
    ok(dstack("namespace", "create", "prod", "--quota", "gpus=50", "--quota", "cost_per_hour=200"))
    ok(dstack("namespace", "set", "dev", "--quota", "gpu_hours_per_day=none"))
    assert path.read_text() == (
        "namespaces:\n"
        "  dev:\n"
        "    gpus: 20  # agreed with finance\n"
        "    per_user:\n"
        "      gpus: 4\n"
        "    users:\n"
        "      alice:\n"
        "        gpu_hours_per_day: 5\n"
        "  prod:\n"
        "    gpus: 50\n"
        "    cost_per_hour: 200\n"
    )

    listed = ok(dstack("namespace", "list")).stdout.splitlines()
    assert listed == [
        "NAMESPACE  USER        GPUS    GPU-HOURS TODAY  COST/H",
        "dev                    0 / 20  0                $0",
        "dev        (per user)  4       -                -",
        "dev        alice       0       0 / 5            $0",
        "prod                   0 / 50  0                $0 / $200",
    ]
    view = json.loads(ok(dstack("namespace", "list", "--json")).stdout)
    dev = view["namespaces"][0]
    assert dev["limits"] == {"gpus": 20, "gpu_hours_per_day": None, "cost_per_hour": None}
    assert dev["users"][0]["name"] == "alice" and dev["users"][0]["own_limits"] is True

    ok(dstack("namespace", "limit", "dev", "--user", "alice", "--clear"))
    ok(dstack("namespace", "delete", "prod"))
    assert "prod" not in path.read_text() and "alice" not in path.read_text()
    assert not (project / ".dstack" / "state.json").exists()  # listing wrote no state


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "dev", "--quota", "gpus=lots"], "--quota 'gpus=lots': expected a number"),
        (["create", "dev", "--quota", "gpus"], "--quota 'gpus': expected KEY=VALUE"),
        (["create", "dev", "--quota", "vram=2"], "unknown limit 'vram'"),
        (["create", "Dev"], "invalid namespace name 'Dev'"),
        (["create", "team"], "namespace 'team' exists already"),
        (["set", "qa", "--quota", "gpus=1"], "no namespace 'qa' in .dstack/quotas.yml"),
        (["set", "team"], "give at least one --quota"),
        (["limit", "team", "--limit", "gpus=1"], "give one of --user NAME or --per-user"),
        (["limit", "team", "--user", "bob"], "give at least one --limit"),
        (["delete", "qa"], "no namespace 'qa'"),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(
    dstack: Dstack, tmp_path: Path, args: list[str], message: str
) -> None:
    ok(dstack("namespace", "create", "team", "--quota", "gpus=8"))
    before = (tmp_path / "project" / QUOTAS).read_text()
    failed = dstack("namespace", *args)
    assert failed.returncode == 1
    assert message in failed.stderr
    assert "Traceback" not in failed.stderr
    assert (tmp_path / "project" / QUOTAS).read_text() == before


def test_a_broken_quota_file_is_reported_with_its_location(dstack: Dstack, tmp_path: Path) -> None:
    (tmp_path / "project" / ".dstack").mkdir()
    (tmp_path / "project" / QUOTAS).write_text("namespaces:\n  dev:\n    gpus: -3\n")
    for args in (["list"], ["set", "dev", "--quota", "gpus=1"]):
        failed = dstack("namespace", *args)
        assert failed.returncode == 1
        assert ".dstack/quotas.yml:3:11: error: namespaces.dev.gpus: must be at least 0" in (
            failed.stderr
        )


@pytest.fixture
def alice_with_one_gpu(cli_env: dict[str, str], tmp_path: Path) -> Dstack:
    """`dstack` run as user alice, whose local agent sees one fake GPU."""
    bin_dir = fake_nvidia_smi(tmp_path / "fake-bin", FAKE_NVIDIA_SMI)
    return gpu_cli(cli_env, tmp_path / "project", bin_dir, DSTACK_PLAN_USER="alice")


TASK = """\
type: task
name: infer
namespace: dev
stop_duration: 1s
commands: [exec sleep 300]
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: 50%}
"""


def test_list_shows_what_a_running_run_holds(alice_with_one_gpu: Dstack, tmp_path: Path) -> None:
    dstack = alice_with_one_gpu
    ok(dstack("namespace", "create", "dev", "--quota", "gpus=2"))
    ok(dstack("namespace", "limit", "dev", "--per-user", "--limit", "gpus=1"))
    (tmp_path / "project" / "infer.dstack.yml").write_text(TASK)
    try:
        ok(dstack("apply", "-y"))
        wait_for_status(dstack, "task.infer", {"running"})
        listed = ok(dstack("namespace", "list")).stdout.splitlines()
        assert listed[1].split()[:4] == ["dev", "0.5", "/", "2"], listed
        assert listed[3].split()[:6] == ["dev", "alice", "(per", "user)", "0.5", "/"], listed
        view = json.loads(ok(dstack("namespace", "list", "--json")).stdout)
        (dev,) = view["namespaces"]
        assert dev["usage"]["gpus"] == 0.5
        assert dev["users"][0]["name"] == "alice"
        assert dev["users"][0]["usage"]["gpus"] == 0.5
        assert dev["users"][0]["limits"]["gpus"] == 1
    finally:
        ok(dstack("destroy", "-y"))
