"""Log lines as JSON (`--log-format json`) for the CLI and the agent, text otherwise."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstack_plan.agent.logformat import CONTEXT_FIELDS, KEYS, JsonFormatter, configure, rfc3339
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
    assert entry["message"] == "job t-0 gone"
    assert "\n" not in line


def test_every_key_is_there_in_order_null_when_the_call_gave_no_context() -> None:
    entry = json.loads(JsonFormatter().format(record("plain")))
    assert tuple(entry) == KEYS
    assert KEYS == (
        "ts",
        "level",
        "event",
        "address",
        "job_id",
        "host",
        "resource_type",
        "span_id",
        "message",
        "logger",
    )
    assert all(entry[k] is None for k in CONTEXT_FIELDS)


def test_the_extra_fields_of_a_log_call_become_keys() -> None:
    rec = record("stopping")
    context = {
        "event": "gang_stop",
        "address": "task.train",
        "job_id": "train-0-1-0",
        "host": "gpu",
        "resource_type": "job",
        "span_id": "task.train@1",
    }
    for name, value in context.items():
        setattr(rec, name, value)  # what `extra=` does
    entry = json.loads(JsonFormatter().format(rec))
    assert {k: entry[k] for k in context} == context


def test_ts_is_rfc3339_utc_with_milliseconds() -> None:
    rec = record("x")
    rec.created = 1_764_600_570.1239
    entry = json.loads(JsonFormatter().format(rec))
    assert entry["ts"] == "2025-12-01T14:49:30.123Z"
    parsed = datetime.fromisoformat(entry["ts"].replace("Z", "+00:00"))
    assert parsed.tzinfo is not None and parsed.utcoffset() == timedelta(0)
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


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


def test_json_lines_default_to_level_info(tmp_path: Path) -> None:
    app_logger = logging.getLogger("dstack_plan.cli.app")
    CliRunner().invoke(app, ["--log-format", "json", "graph", str(tmp_path)])
    assert logging.getLogger().level == logging.INFO and app_logger.isEnabledFor(logging.INFO)
    CliRunner().invoke(app, ["--log-level", "error", "--log-format", "json", "graph"])
    assert logging.getLogger().level == logging.ERROR


def test_the_cli_refuses_an_unknown_format() -> None:
    result = CliRunner().invoke(app, ["--log-format", "xml", "graph"])
    assert result.exit_code == 1 and "the format one of text, json" in result.output
