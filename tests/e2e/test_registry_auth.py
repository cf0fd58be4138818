"""A private image is pulled with the run's `registry_auth`, whose password comes from a secret
and is then nowhere: not in state, plans, output, or the agent's files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.e2e.conftest import Dstack
from tests.infra.docker_images import ensure_busybox_image
from tests.infra.registry import missing_tools, private_registry

pytestmark = pytest.mark.docker

TASK = """\
type: task
name: private
image: {image}
commands:
  - echo private-image-ok
resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}
"""
AUTH = """\
registry_auth:
  username: ${{ secrets.REGISTRY_USER }}
  password: ${{ secrets.REGISTRY_PASSWORD }}
"""


def test_a_private_image_is_pulled_with_the_runs_registry_auth(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], docker_client: Any
) -> None:
    if missing_tools():
        require("DSTACK_PLAN_REQUIRE_DOCKER", f"no private registry: missing {missing_tools()}")
    with private_registry(tmp_path / "registry") as registry:
        image = registry.push(docker_client, ensure_busybox_image(docker_client), "team/busybox")
        config = tmp_path / "project" / "private.dstack.yml"

        config.write_text(TASK.format(image=image))
        refused = dstack("apply", "-y", "--attach")
        assert refused.returncode == 1
        assert "no basic auth credentials" in refused.stdout + refused.stderr

        config.write_text(TASK.format(image=image) + AUTH)
        cli_env["DSTACK_SECRET_REGISTRY_USER"] = registry.username
        cli_env["DSTACK_SECRET_REGISTRY_PASSWORD"] = registry.password
        outputs = [dstack("plan", "-out", "saved.json"), dstack("apply", "-y", "--attach")]
        assert outputs[-1].returncode == 0, outputs[-1].stdout + outputs[-1].stderr
        assert "private-image-ok" in outputs[-1].stdout
        outputs += [dstack("ps", "-a"), dstack("logs", "private")]
        assert dstack("destroy", "-y").returncode == 0

    for result in outputs:
        assert registry.password not in result.stdout + result.stderr
    files = [tmp_path / "project" / "saved.json", *(tmp_path / "project" / ".dstack").rglob("*")]
    files += (tmp_path / "agent").rglob("*")
    for path in files:
        if path.is_file():
            assert registry.password.encode() not in path.read_bytes(), f"password in {path}"
