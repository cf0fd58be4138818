"""The runnable examples run here: the quickstart as a process and, with Docker, in a container."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.conftest import Dstack


def test_quickstart_runs_on_the_local_fleet(dstack: Dstack, tmp_path: Path) -> None:
    state = tmp_path / "quickstart-state.json"
    result = dstack(
        "apply",
        "-y",
        "--attach",
        "--state",
        str(state),
        str(REPO_ROOT / "examples" / "quickstart"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Hello from dstack-plan on" in result.stdout
    assert "sum of squares 1..1000 = 333833500" in result.stdout
    destroyed = dstack("destroy", "-y", "--state", str(state), str(REPO_ROOT / "examples"))
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr


@pytest.mark.docker
def test_quickstart_runs_in_a_container(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, docker_client
) -> None:
    from tests.infra.docker_images import ensure_busybox_image

    ensure_busybox_image(docker_client, name="dstack-plan-examples/busybox:latest")
    state = tmp_path / "docker-state.json"
    example = REPO_ROOT / "examples" / "quickstart-docker"
    result = dstack("apply", "-y", "--attach", "--state", str(state), str(example))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Hello from a container on" in result.stdout
    assert "sum of 1..1000 = 500500" in result.stdout
    assert dstack("destroy", "-y", "--state", str(state), str(example)).returncode == 0
    # this test's agent's: another test run may apply the example at the same time
    agent = f"dstack-plan.agent-id={(agent_dir / 'agent_id').read_text().strip()}"
    leftover = docker_client.containers.list(
        all=True, filters={"label": ["dstack-plan.run-name=hello-docker", agent]}
    )
    assert leftover == []
