"""A job that prints its secret: `apply --attach`, `dstack logs` and `dstack logs --json` show
`(sensitive)`, never the value, and no file of the agent or the project holds it (the agent
masks the log as it stores it, so every reader sees the same)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack
from tests.infra.docker_images import ensure_busybox_image

TASK = """\
type: task
name: prints-secret
{image}env:
  - TOKEN=${{{{ secrets.TOKEN }}}}
commands:
  - echo "token=$TOKEN"
  - printf %s "$TOKEN" | cut -c1-3
  - printf %s "$TOKEN" | head -c 7; sleep 0.3; printf '%s\\n' "$TOKEN" | tail -c +8
  - printf %s "$TOKEN"
resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}
"""


def check(dstack: Dstack, tmp_path: Path, image: str | None) -> None:
    token = "tok-" + secrets.token_hex(12)
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(TASK.format(image=f"image: {image}\n" if image else ""))
    (project / ".dstack").mkdir(mode=0o700)
    secrets_file = project / ".dstack" / "secrets.yml"
    secrets_file.write_text(f"TOKEN: {token}\n")
    secrets_file.chmod(0o600)

    attached = dstack("apply", "-y", "--attach", timeout=120)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    text = dstack("logs", "prints-secret")
    as_json = dstack("logs", "prints-secret", "--json")
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr

    for result in (attached, text):
        assert "token=(sensitive)" in result.stdout
        assert f"\n{token[:3]}\n(sensitive)\n(sensitive)" in result.stdout
    messages = [json.loads(line)["message"] for line in as_json.stdout.splitlines() if line]
    assert messages[-4:] == ["token=(sensitive)", token[:3], "(sensitive)", "(sensitive)"]
    for result in (attached, text, as_json):
        assert token not in result.stdout + result.stderr

    files = [p for p in (tmp_path / "agent").rglob("*") if p.is_file()]
    files += [p for p in (project / ".dstack").rglob("*") if p.is_file() and p != secrets_file]
    assert any(p.name.endswith(".log") and p.parent.name == "logs" for p in files)
    for path in files:
        assert token.encode() not in path.read_bytes(), f"the secret value is in {path}"


def test_a_process_job_printing_its_secret(dstack: Dstack, tmp_path: Path) -> None:
    check(dstack, tmp_path, None)


@pytest.mark.docker
def test_a_container_job_printing_its_secret(
    dstack: Dstack, tmp_path: Path, docker_client: Any
) -> None:
    check(dstack, tmp_path, ensure_busybox_image(docker_client))


EMBEDDED = """\
type: task
name: prints-password
env:
  - DB_URL=postgres://app:${{ secrets.DB_PASSWORD }}@db:5432/main
commands:
  - echo "url=$DB_URL"
  - echo "$DB_URL" | sed 's|.*://app:||; s|@.*||'
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def test_a_secret_inside_a_larger_value_is_masked_alone_too(
    dstack: Dstack, tmp_path: Path
) -> None:
    """The agent gets the secret's bare value beside the env value that holds it, so a job
    printing only the password prints `(sensitive)`."""
    password = "pw-" + secrets.token_hex(10)
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(EMBEDDED)
    (project / ".dstack").mkdir(mode=0o700)
    secrets_file = project / ".dstack" / "secrets.yml"
    secrets_file.write_text(f"DB_PASSWORD: {password}\n")
    secrets_file.chmod(0o600)
    attached = dstack("apply", "-y", "--attach", timeout=120)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    logs = dstack("logs", "prints-password")
    for result in (attached, logs):
        assert "url=(sensitive)" in result.stdout
        assert "\n(sensitive)\n" in result.stdout + "\n"
        assert password not in result.stdout + result.stderr
    for path in (p for p in (tmp_path / "agent").rglob("*") if p.is_file()):
        assert password.encode() not in path.read_bytes(), f"the secret value is in {path}"
