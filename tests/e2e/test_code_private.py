"""`files: [.]` in a project where `dstack init` never ran: the job gets the project's files
but not its `.dstack/` (secrets, state, tokens), the apply goes through although it writes
the state inside the directory it sends, and the host keeps no copy after destroy."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.conftest import Dstack

SECRET = "dot-dstack-secret-5e81c0"
TASK = """\
type: task
name: lists
files: [.]
commands:
  - ls -A1
  - stat -c '%a %n' key.pem
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def every_file_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def logs_of(dstack: Dstack, run: str, last_line: str) -> list[str]:
    deadline = time.monotonic() + 30
    while True:
        logs = dstack("logs", run)
        lines = logs.stdout.splitlines()
        if last_line in lines:
            return lines
        assert time.monotonic() < deadline, logs.stdout + logs.stderr
        time.sleep(0.2)


def test_files_dot_without_init_sends_no_dstack_dir(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(TASK)
    (project / "train.py").write_text("print('train')\n")
    (project / "key.pem").write_text("private key\n")
    (project / "key.pem").chmod(0o600)
    (project / ".dstack").mkdir(mode=0o700)
    (project / ".dstack" / "secrets.yml").write_text(f"API_TOKEN: {SECRET}\n")
    (project / ".dstack" / "secrets.yml").chmod(0o600)
    (project / ".dstack" / "ui-token").write_text(SECRET)
    (project / ".dstack" / "service-token").write_text(SECRET)

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    lines = logs_of(dstack, "lists", "600 key.pem")
    assert lines[: lines.index("600 key.pem")] == ["key.pem", "t.dstack.yml", "train.py"]

    blobs = tmp_path / "agent" / "blobs"
    assert [p.name for p in blobs.iterdir()], "the code archive is on the host while its job is"
    for path in every_file_under(tmp_path / "agent"):
        assert SECRET.encode() not in path.read_bytes(), f"secret found in {path}"
    again = dstack("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr  # the state written: no change

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert list(blobs.iterdir()) == []


def test_a_symlink_out_of_the_project_fails_the_plan_naming_it(
    dstack: Dstack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "t.dstack.yml").write_text(TASK)
    (project / "key.pem").write_text("k\n")
    (tmp_path / "credentials").write_text("aws_secret_access_key = s\n")
    (project / "creds").symlink_to("../credentials")
    planned = dstack("plan")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    message = planned.stdout + planned.stderr
    assert "creds is a symlink to '../credentials'" in message, message
    assert str(tmp_path / "credentials") in " ".join(message.split()), message
