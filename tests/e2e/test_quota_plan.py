"""Quotas at plan time, through the CLI on the local fleet (a real agent seeing two fake GPUs):
a plan over a namespace's or a user's `gpus` fails naming the namespace, the limit and the
amount asked (exit 1, nothing applied); under it, it passes; a run in another namespace does
not count; a saved plan is checked again when it is applied."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_watch_limits import gpu_bin  # noqa: F401  (a fixture: the fake GPUs)


def run_config(name: str, gpus: int, namespace: str | None = None) -> str:
    space = f"namespace: {namespace}\n" if namespace else ""
    return (
        f"type: task\nname: {name}\n{space}commands: ['exec sleep 300']\nstop_duration: 1s\n"
        f"resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: {gpus}}}\n"
    )


class Cli:
    """`dstack` in the project dir, as a given user (DSTACK_PLAN_USER), its agent seeing the
    fake GPUs."""

    def __init__(self, env: dict[str, str], project: Path) -> None:
        self.env = env
        self.project = project

    def __call__(self, *args: str, user: str = "alice") -> subprocess.CompletedProcess:
        env = {**self.env, "DSTACK_PLAN_USER": user}
        return subprocess.run(
            [*CLI, *args], cwd=self.project, env=env, capture_output=True, text=True, timeout=120
        )

    def write(self, name: str, text: str) -> None:
        path = self.project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def cli(cli_env: dict[str, str], tmp_path: Path, gpu_bin: Path) -> Cli:  # noqa: F811
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    env = {**cli_env, "PATH": f"{gpu_bin}:{cli_env.get('PATH', '/usr/bin:/bin')}"}
    return Cli(env, project)


def test_a_plan_over_a_namespace_gpu_quota_fails_and_one_under_it_passes(cli: Cli) -> None:
    cli.write(".dstack/quotas.yml", "namespaces:\n  dev: {gpus: 1}\n")
    cli.write("train.dstack.yml", run_config("train", 2, "dev"))
    planned = cli("plan")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert "namespace dev: gpus limit 1, 0 in use, task.train asks 2" in planned.stderr
    assert "Traceback" not in planned.stderr
    applied = cli("apply", "-y")
    assert applied.returncode == 1
    assert "namespace dev: gpus limit 1" in applied.stderr
    stored = cli.project / ".dstack" / "state.json"
    assert not stored.exists() or "task.train" not in state(cli.project)["resources"]

    cli.write(".dstack/quotas.yml", "namespaces:\n  dev: {gpus: 2}\n")
    planned = cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stderr
    assert cli("apply", "-y").returncode == 0
    wait_for_status(cli, "task.train", {"running"})
    attributes = state(cli.project)["resources"]["task.train"]["attributes"]
    assert (attributes["namespace"], attributes["user"]) == ("dev", "alice")
    assert attributes["jobs"][0]["gpus"] == 2
    assert cli("destroy", "-y").returncode == 0


def test_per_user_limits_count_each_user_and_other_namespaces_do_not_count(cli: Cli) -> None:
    cli.write(
        ".dstack/quotas.yml",
        "namespaces:\n  dev:\n    gpus: 2\n    per_user: {gpus: 1}\n    users:\n"
        "      bob: {gpus: 2}\n  prod: {gpus: 1}\n",
    )
    cli.write("one.dstack.yml", run_config("one", 1, "dev"))
    assert cli("apply", "-y", user="alice").returncode == 0
    wait_for_status(cli, "task.one", {"running"})

    cli.write("two.dstack.yml", run_config("two", 1, "dev"))
    refused = cli("plan", user="alice")
    assert refused.returncode == 1
    assert refused.stderr.count("namespace dev") == 1, refused.stderr  # only alice's limit
    assert "namespace dev, user alice: gpus limit 1, 1 in use, task.two asks 1" in refused.stderr
    # bob has 2 of his own, and the namespace has room for one more
    assert cli("plan", user="bob").returncode == 0

    # prod is counted apart: dev's GPU in use does not count against it
    (cli.project / "two.dstack.yml").unlink()
    cli.write("serve.dstack.yml", run_config("serve", 1, "prod"))
    assert cli("apply", "-y", user="alice").returncode == 0
    wait_for_status(cli, "task.serve", {"running"})
    assert cli("destroy", "-y").returncode == 0


def test_a_saved_plan_is_checked_again_when_applied(cli: Cli) -> None:
    cli.write("train.dstack.yml", run_config("train", 1, "dev"))
    assert cli("plan", "-out", "saved.plan").returncode == 0
    cli.write(".dstack/quotas.yml", "namespaces:\n  dev: {gpus: 0}\n")
    applied = cli("apply", "saved.plan", "-y")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert "namespace dev: gpus limit 0, 0 in use, task.train asks 1" in applied.stderr
