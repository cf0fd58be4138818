"""Secret values reach the job and nothing else: not state, plans, output or agent files."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from tests.e2e.conftest import Dstack

SECRET = "s3cr3t-Value-4d2f9c1e"
TASK = """\
type: task
name: uses-secret
env:
  - API_TOKEN=${{ secrets.API_TOKEN }}
commands:
  - printf '%s' "$API_TOKEN" | sha256sum
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def every_file_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def test_secret_never_leaks(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(TASK)
    (project / ".dstack").mkdir(mode=0o700)
    secrets_file = project / ".dstack" / "secrets.yml"
    secrets_file.write_text(f"API_TOKEN: {SECRET}\n")

    secrets_file.chmod(0o644)
    refused = dstack("apply", "-y")
    assert refused.returncode == 1
    assert "readable by others" in refused.stdout + refused.stderr
    secrets_file.chmod(0o600)

    outputs = []
    for args in (
        ("plan",),
        ("plan", "--json"),
        ("plan", "-out", "saved.json"),
        ("plan", "--format", "markdown", "--markdown", "comment.md"),
    ):
        result = dstack(*args)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout + result.stderr)
    assert "(sensitive)" in outputs[0]
    assert "(sensitive)" in outputs[3] and "API_TOKEN" in outputs[3]  # masked, not dropped
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    outputs.append(applied.stdout + applied.stderr)

    expected = hashlib.sha256(SECRET.encode()).hexdigest()
    deadline = time.monotonic() + 30
    while True:
        logs = dstack("logs", "uses-secret")
        if expected in logs.stdout:
            break
        assert time.monotonic() < deadline, logs.stdout + logs.stderr
        time.sleep(0.2)
    outputs += [
        logs.stdout + logs.stderr,
        dstack("ps", "-a").stdout,
        dstack("ps", "--json").stdout,
    ]

    for text in outputs:
        assert SECRET not in text
    files = every_file_under(project / ".dstack") + [project / "saved.json"]
    files.append(project / "comment.md")
    files += every_file_under(tmp_path / "agent")
    files += list(tmp_path.glob("*.log"))
    for path in files:
        if path == secrets_file:
            continue
        assert SECRET.encode() not in path.read_bytes(), f"secret found in {path}"
    assert (project / ".dstack" / "state.json").stat().st_mode & 0o777 == 0o600


def test_secret_from_environment_variable(dstack: Dstack, tmp_path: Path, cli_env) -> None:
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(TASK)
    missing = dstack("apply", "-y")
    assert missing.returncode == 1
    assert "secret 'API_TOKEN' is not set" in missing.stdout + missing.stderr
    cli_env["DSTACK_SECRET_API_TOKEN"] = SECRET
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert SECRET not in (project / ".dstack" / "state.json").read_text()
    assert os.environ.get("DSTACK_SECRET_API_TOKEN") is None
