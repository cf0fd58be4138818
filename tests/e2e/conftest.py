"""The CLI as a user runs it, with its own agent data dir per test (stopped afterwards)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BUNDLE_CACHE_ENV, REPO_ROOT

CLI = [sys.executable, "-m", "dstack_plan.cli"]
Dstack = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def agent_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "agent"
    yield path
    subprocess.run(
        [sys.executable, "-m", "dstack_plan.agent", "stop", "--data-dir", str(path)],
        capture_output=True,
        timeout=60,
    )


@pytest.fixture
def cli_env(agent_dir: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTACK_")}
    env.update(
        NO_COLOR="1",
        COLUMNS="200",
        DSTACK_PLAN_AGENT_DIR=str(agent_dir),
        # `dstack attach` on a dev environment writes its SSH entry here, never into ~/.ssh
        DSTACK_PLAN_SSH_CONFIG_DIR=str(tmp_path / "ssh-config"),
        PYTHONPATH=str(REPO_ROOT),
        # the session's cache of agent bundles (tests/conftest.py), whatever HOME a test sets
        DSTACK_PLAN_CACHE_DIR=os.environ[BUNDLE_CACHE_ENV],
        # Cloud SDKs looking for credentials would ask the metadata server of a cloud VM
        # (169.254.169.254): keep them on this machine
        NO_GCE_CHECK="True",
    )
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        env.pop(name, None)
    return env


@pytest.fixture
def secret_scan(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[SecretScan]:
    """After the test, no secret value it used is anywhere README and docs/agent.md say it
    never goes: the CLI's output (every `dstack` call of the test), state and plan files, the
    event log and every other file of the projects' `.dstack/` (but the secrets file), and
    the agents' data dirs (the local one, and the SSH hosts' under tmp_path). The values are
    those of every `.dstack/secrets.yml` under tmp_path and every `DSTACK_SECRET_*`."""
    scan = SecretScan()
    yield scan
    scan.check(tmp_path, cli_env)


@pytest.fixture
def dstack(cli_env: dict[str, str], tmp_path: Path, secret_scan: SecretScan) -> Dstack:
    """Run `dstack ARGS...` in the project dir (default tmp_path/project); its output is
    kept for the secret scan."""

    def run(
        *args: str, cwd: Path | None = None, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [*CLI, *args],
            cwd=cwd or tmp_path / "project",
            env=cli_env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        secret_scan.outputs.append((" ".join(args), f"{done.stdout}{done.stderr}"))
        return done

    (tmp_path / "project").mkdir(exist_ok=True)
    return run


class SecretScan:
    """What the `secret_scan` fixture checks after a test (see it)."""

    MIN_LENGTH = 6
    """Shorter values (a test's `1`) would be found everywhere and prove nothing."""

    def __init__(self) -> None:
        self.outputs: list[tuple[str, str]] = []
        """(the command's arguments, what it printed) of each `dstack` call."""

    def values(self, root: Path, cli_env: dict[str, str]) -> set[str]:
        import yaml

        found = {v for k, v in cli_env.items() if k.startswith("DSTACK_SECRET_")}
        for path in root.rglob(".dstack/secrets.yml"):
            data = yaml.safe_load(path.read_text()) or {}
            found |= {str(v) for v in data.values()} if isinstance(data, dict) else set()
        return {v for v in found if len(v) >= self.MIN_LENGTH}

    def check(self, root: Path, cli_env: dict[str, str]) -> None:
        values = self.values(root, cli_env)
        if not values:
            return
        where: list[str] = []
        for args, printed in self.outputs:
            where += [f"the output of `dstack {args}`" for v in values if v in printed]
        for path in _never_holding_secrets(root):
            data = path.read_bytes()
            where += [str(path) for v in values if v.encode() in data]
        assert not where, "a secret value is where it must never be: " + "; ".join(where)


_SECRET_FILES = frozenset({"secrets.yml", "ui-token", "service-token"})
"""What a project's `.dstack/` keeps secret on purpose (a test may give them one value)."""


def _never_holding_secrets(root: Path) -> Iterator[Path]:
    """The files of `root` that never hold a secret value: the projects' `.dstack/` (but the
    secrets file), the local agent's dir (`agent/`) and the SSH hosts' agents' data dirs
    (`hosts/NODE/data/`): job records, logs, blobs."""
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        parts = path.relative_to(root).parts
        if "work" in parts:  # a job's own working files are the job's business
            continue
        if ".dstack" in parts and path.name not in _SECRET_FILES:
            yield path
        elif parts[0] == "agent" or ("hosts" in parts and "data" in parts):
            yield path


def fake_nvidia_smi(directory: Path, script: str) -> Path:
    """Write `script` as an executable `directory/nvidia-smi`; return `directory` (to put first
    on the PATH of the agent, which then sees the GPUs the script reports)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nvidia-smi").write_text(script)
    (directory / "nvidia-smi").chmod(0o755)
    return directory


def gpu_cli(cli_env: dict[str, str], project: Path, bin_dir: Path, **env: str) -> Dstack:
    """`dstack ARGS... [user=NAME]` in `project`, its local agent (started by the first apply)
    seeing the fake GPUs of `bin_dir` (`fake_nvidia_smi`); `user` sets DSTACK_PLAN_USER."""
    base = {**cli_env, "PATH": f"{bin_dir}:{cli_env.get('PATH', '/usr/bin:/bin')}", **env}
    project.mkdir(parents=True, exist_ok=True)

    def run(*args: str, user: str | None = None) -> subprocess.CompletedProcess:
        run_env = base if user is None else {**base, "DSTACK_PLAN_USER": user}
        return subprocess.run(
            [*CLI, *args], cwd=project, env=run_env, capture_output=True, text=True, timeout=120
        )

    return run


@pytest.fixture(params=["local", "s3"])
def state_backend(
    request: pytest.FixtureRequest, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> str:
    """Run the test once per state backend: the local file, and an S3 object on moto's
    server, chosen the way CI chooses it (`DSTACK_STATE=s3://...`, for the CLI and for the
    test's own `Project`s and `state()` reads). Modules opt in with
    `pytestmark = pytest.mark.usefixtures("state_backend")`."""
    if request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        cli_env.update(bucket.env, DSTACK_STATE=bucket.url())
        monkeypatch.setenv("DSTACK_STATE", bucket.url())
    return str(request.param)
