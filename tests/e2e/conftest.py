"""The CLI as a user runs it, with its own agent data dir per test (stopped afterwards)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

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
        # Cloud SDKs looking for credentials would ask the metadata server of a cloud VM
        # (169.254.169.254): keep them on this machine
        NO_GCE_CHECK="True",
    )
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        env.pop(name, None)
    return env


@pytest.fixture
def dstack(cli_env: dict[str, str], tmp_path: Path) -> Dstack:
    """Run `dstack ARGS...` in the project dir (default tmp_path/project)."""

    def run(
        *args: str, cwd: Path | None = None, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*CLI, *args],
            cwd=cwd or tmp_path / "project",
            env=cli_env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    (tmp_path / "project").mkdir(exist_ok=True)
    return run


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
