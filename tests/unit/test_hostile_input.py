"""Input that used to pass `validate` and fail (or worse, pass) later: a trailing newline
slipping past `^...$` patterns, shell characters in an image or user, control and bidi
characters in messages, an agent dir pasted unquoted into the pre-flight's shell."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dstack_plan.config.labels import check_key, check_value
from dstack_plan.config.loader import load_project
from dstack_plan.errors import ConfigError, ConfigIssue, shown
from dstack_plan.plan.limits import checked_dependencies
from dstack_plan.providers.ssh.preflight import _script


def _errors(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "t.dstack.yml").write_text(text)
    try:
        checked_dependencies(load_project(tmp_path), tmp_path)
    except ConfigError as e:
        return [str(i) for i in e.issues]
    return []


TASK = 'type: task\nname: tt\ncommands: ["true"]\n'


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ('image: "x;touch /tmp/pwned"', "image 'x;touch /tmp/pwned' must not contain whitespace"),
        ('image: "busybox\\n"', "image 'busybox\\n' must not contain whitespace"),
        ('image: "a$(id)b"', "contains characters not allowed in an image reference"),
        ('user: "root$(id)"', "user 'root$(id)': expected user[:group]"),
        ('user: "root\\n"', "user 'root\\n': expected user[:group]"),
        ('shell: "bash\\n"', "shell must be 'sh', 'bash' or an absolute path"),
        ('env: {"A\\n": "1"}', "invalid env variable name 'A\\n'"),
    ],
)
def test_what_the_agent_would_refuse_is_refused_at_its_line(
    tmp_path: Path, field: str, message: str
) -> None:
    [error] = _errors(tmp_path, TASK + field + "\n")
    assert error.startswith("t.dstack.yml:4:") and message in error
    assert "\n" not in error  # one error, one line


def test_interpolated_images_and_users_are_checked_by_the_agent(tmp_path: Path) -> None:
    text = TASK + 'image: "${{ env.IMAGE }}"\nuser: "${{ env.RUN_AS }}"\n'
    assert _errors(tmp_path, text) == []
    assert _errors(tmp_path, TASK + "image: ghcr.io/org/img:1.0@sha256:" + "a" * 64 + "\n") == []


def test_label_keys_and_values_are_matched_whole() -> None:
    for bad in ("rack\n", "rack\nzone"):
        with pytest.raises(ValueError):
            check_key(bad)
        with pytest.raises(ValueError):
            check_value("rack", bad)
    assert check_key("rack") == "rack" and check_value("rack", "r1") == "r1"


def test_messages_escape_control_and_bidi_characters() -> None:
    issue = ConfigIssue("a\u202eb.dstack.yml", 1, 2, "unknown key 'x\u2028y\x85z\nw'")
    text = str(issue)
    assert "\n" not in text and "\u202e" not in text and "\u2028" not in text
    assert "a\\u202eb.dstack.yml:1:2: error: unknown key 'x\\u2028y\\x85z\\nw'" == text
    assert shown("line 1\nline 2", keep_newlines=True) == "line 1\nline 2"
    assert shown("tab\tand é stay") == "tab\tand é stay"


def test_the_preflight_quotes_the_agent_dir(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    agent_dir = f"{tmp_path}/a b;touch {canary};#"
    script = _script(agent_dir, need_containers=False)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert not canary.exists()
    assert "free_kb=" in done.stdout  # it measured the nearest existing directory
