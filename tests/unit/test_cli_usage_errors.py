"""Bad usage exits 1, like every other error: exit code 2 belongs to
`plan --detailed-exitcode` (changes present), so a CI gate must never see it for a typo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstack_plan.cli.app import build_app, invoked_command

BAD_USAGE = [
    (["plan", "--detailed-exitcode", "--bogus"], "No such option: --bogus"),
    (["plna"], "No such command 'plna'"),
    (["logs"], "Missing argument"),
    (["state", "lst"], "No such command 'lst'"),
    (["plan", "--parallelism", "x"], "No such option"),
    (["apply", "--parallelism", "many"], "Invalid value for '--parallelism'"),
    (["--log-format", "xml", "graph"], "the format one of text, json"),
    ([], "Usage: dstack"),
]


@pytest.mark.parametrize(("args", "message"), BAD_USAGE)
def test_bad_usage_exits_1_with_clicks_message(args: list[str], message: str) -> None:
    app = build_app(only=invoked_command(args))  # what the console script builds
    result = CliRunner().invoke(app, args, env={"NO_COLOR": "1"})
    assert result.exit_code == 1, result.output
    assert message in result.output


def test_the_console_script_exits_1_on_a_mistyped_option(tmp_path: Path) -> None:
    (tmp_path / "app.dstack.yml").write_text("type: task\nname: t\ncommands: [echo hi]\n")
    common = [sys.executable, "-m", "dstack_plan.cli", "plan", str(tmp_path)]
    common += ["--detailed-exitcode", "--state", str(tmp_path / "state.json")]
    typo = subprocess.run(
        [*common, "--tagret", "task.t"], capture_output=True, text=True, timeout=60, check=False
    )
    assert typo.returncode == 1 and "No such option: --tagret" in typo.stderr
    assert "Traceback" not in typo.stderr
