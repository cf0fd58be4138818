"""Which process-job commands run without a shell (`agent/runtimes/direct_exec.py`): exactly
those the shell would only have split into words and executed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dstack_plan.agent.runtimes.direct_exec import direct_argv

PATH = os.defpath


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("sleep 3600", ["sleep", "3600"]),
        ("  sleep\t3600 ", ["sleep", "3600"]),
        ("env -i A=1 sleep 1", ["env", "-i", "A=1", "sleep", "1"]),  # `=` past the first word
        (
            "python3 -m http.server --bind=127.0.0.1",
            ["python3", "-m", "http.server", "--bind=127.0.0.1"],
        ),
    ],
)
def test_plain_program_calls_are_split_into_their_words(command: str, argv: list[str]) -> None:
    assert direct_argv([command], PATH, Path("/")) == argv


@pytest.mark.parametrize(
    "command",
    [
        "sleep 1 && sleep 2",  # an operator
        "sleep 1; sleep 2",
        "sleep 1 | cat",
        "sleep 1 > out.txt",
        "sleep $SECONDS",  # an expansion
        "sleep ~",
        "sleep 'one'",  # quoting
        'sleep "one"',
        "sleep one\\ two",
        "ls *.py",  # a glob
        "sleep 1 # a comment",
        "DEBUG=1 sleep 1",  # an assignment
        "echo hi",  # builtins that a program of the same name does not quite match
        "kill 1",
        "true",
        "cd /tmp",
        "exit 3",
        "time sleep 1",
        "no-such-program-anywhere --help",  # the shell says `not found` with status 127
        "sleep 1\nsleep 2",  # two lines: two commands
        "",
    ],
)
def test_anything_the_shell_would_interpret_keeps_the_shell(command: str) -> None:
    assert direct_argv([command], PATH, Path("/")) is None


def test_two_commands_keep_the_shell() -> None:
    assert direct_argv(["sleep 1", "sleep 2"], PATH, Path("/")) is None


def test_a_relative_program_is_looked_up_in_the_working_dir(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    assert direct_argv(["./run.sh --fast"], PATH, tmp_path) is None  # not executable
    script.chmod(0o755)
    assert direct_argv(["./run.sh --fast"], PATH, tmp_path) == ["./run.sh", "--fast"]
    assert direct_argv(["./run.sh"], PATH, tmp_path / "elsewhere") is None


def test_the_programs_are_found_on_the_jobs_path(tmp_path: Path) -> None:
    program = tmp_path / "trainer"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert direct_argv(["trainer --epochs 3"], PATH, Path("/")) is None
    found = direct_argv(["trainer --epochs 3"], f"{tmp_path}:{PATH}", Path("/"))
    assert found == ["trainer", "--epochs", "3"]
