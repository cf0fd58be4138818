"""Log lines as JSON (`--log-format json`) for the CLI and the agent, text otherwise."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstack_plan.agent.logformat import JsonFormatter, configure
from dstack_plan.cli.app import app


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            info = sys.exc_info()
    return logging.LogRecord("dstack_plan.x", logging.WARNING, __file__, 1, message, args, info)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_json_line_has_time_level_logger_and_message() -> None:
    line = JsonFormatter().format(record("job %s gone", "t-0"))
    entry = json.loads(line)
    assert entry["level"] == "warning" and entry["logger"] == "dstack_plan.x"
    assert entry["message"] == "job t-0 gone" and entry["time"].endswith("+00:00")
    assert "\n" not in line


def test_an_exception_travels_inside_the_line() -> None:
    entry = json.loads(JsonFormatter().format(record("failed", exc=True)))
    assert "RuntimeError: boom" in entry["exception"]


def test_an_unknown_format_or_level_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="format 'xml'.*the format one of text, json"):
        configure("info", "xml")
    with pytest.raises(ValueError, match="level 'loud'.*debug, info, warning, error"):
        configure("loud", "text")


def test_the_cli_logs_json_lines_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dstack_plan.project import Project

    # a volume needs no agent to plan; pretend its provider could create it (none can yet)
    monkeypatch.setattr(Project, "unsupported", lambda self, items: {})
    volume = "type: volume\nname: data\nbackend: aws\nregion: x\nsize: 10GB\n"
    (tmp_path / "v.dstack.yml").write_text(volume)
    args = ["--log-level", "debug", "--log-format", "json", "plan", str(tmp_path)]
    args += ["--state", str(tmp_path / "state.json")]
    result = CliRunner().invoke(app, args, env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and all(json.loads(line)["level"] for line in lines)
    assert "Plan: 1 to add" in result.stdout


def test_the_cli_refuses_an_unknown_format() -> None:
    result = CliRunner().invoke(app, ["--log-format", "xml", "graph"])
    assert result.exit_code == 1 and "the format one of text, json" in result.output
