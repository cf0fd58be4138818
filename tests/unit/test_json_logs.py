"""Structured lines of events and job output: levels, messages, the logged event log, and the
line splitting and time-ordered merge of `dstack logs --json`."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import LogChunk
from dstack_plan.agent.logformat import KEYS, JsonFormatter
from dstack_plan.inspect.json_logs import Merger, TimedLines, event_entry
from dstack_plan.state.events import Event, event_level, event_message, span_id
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.secrets import SecretGuard
from dstack_plan.watch.events import LoggedEventLog

T0 = 1_700_000_000.0
SPAN = span_id("task.train", 7)


def ev(new: str, *, old: str | None = "running", reason: str | None = None, **kw: object) -> Event:
    fields: dict[str, object] = {
        "time": T0,
        "address": "task.train",
        "kind": "run",
        "span_id": SPAN,
        "old_status": old,
        "new_status": new,
        "reason": reason,
    }
    return Event.model_validate({**fields, **kw})


def test_levels_follow_how_serious_the_move_is() -> None:
    assert event_level(ev("failed", reason="exit code 3")) == "error"
    assert event_level(ev("terminated", reason="stopped by the user")) == "warning"
    assert event_level(ev("terminating", reason="max_duration_exceeded")) == "warning"
    assert event_level(ev("running", old="pending")) == "info"
    assert event_level(ev("done")) == "info"


def test_the_message_is_old_to_new_with_the_reason() -> None:
    assert event_message(ev("failed", reason="exit code 3")) == "running -> failed: exit code 3"
    assert event_message(ev("submitted", old=None)) == "- -> submitted"


def test_an_event_line_has_every_key_and_the_event_kind_as_resource_type() -> None:
    entry = event_entry(ev("failed", kind="gpu", host="gpu-1", reason="utilization"))
    assert tuple(entry) == KEYS
    assert entry["event"] == "status_changed" and entry["level"] == "error"
    assert entry["resource_type"] == "gpu" and entry["host"] == "gpu-1"
    assert entry["span_id"] == SPAN and entry["ts"] == "2023-11-14T22:13:20.000Z"


def test_the_logged_event_log_logs_each_event_as_structured_json_without_secrets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = LoggedEventLog(
        LocalBackend(tmp_path / "state.json"), secret_guard=SecretGuard(["hunter2"])
    )
    job = ev("failed", kind="job", job_id="train-0-0-0", host="gpu", reason="token hunter2")
    with caplog.at_level(logging.INFO, logger="dstack_plan.watch.events"):
        log.append([ev("running", old="pending"), job])
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert [line["level"] for line in lines] == ["info", "error"]
    assert all(line["event"] == "status_changed" and line["span_id"] == SPAN for line in lines)
    assert lines[1]["job_id"] == "train-0-0-0" and lines[1]["host"] == "gpu"
    assert lines[1]["resource_type"] == "job" and lines[0]["resource_type"] == "run"
    assert "hunter2" not in json.dumps(lines) and "(sensitive)" in lines[1]["message"]
    assert [e.new_status for e in log.read()] == ["running", "failed"]


def chunk(offset: int, data: bytes, times: list[tuple[int, float]]) -> LogChunk:
    return LogChunk(
        job_id="j", offset=offset, next_offset=offset + len(data), data=data, times=times
    )


def test_lines_are_dated_by_the_time_of_their_first_byte_across_chunks() -> None:
    lines = TimedLines()
    got = lines.feed(chunk(0, b"a\nbb", [(0, 1.0), (3, 2.0)]))
    assert got == [(1.0, "a")]
    got = lines.feed(chunk(4, b"b\r\nc\n", [(4, 2.0), (6, 3.0)]))
    assert got == [(1.0, "bbb"), (3.0, "c")]  # "bbb" starts at offset 2, before (3, 2.0)
    assert lines.feed(chunk(8, b"tail", [])) == [] and lines.flush() == [(3.0, "tail")]
    assert TimedLines().feed(chunk(0, b"old agent\n", [])) == [(None, "old agent")]


def test_line_end_is_where_the_next_whole_line_starts() -> None:
    lines = TimedLines()
    lines.feed(chunk(0, b"a\nbb", []))
    assert lines.line_end == 2  # "bb" is not a whole line yet
    lines.feed(chunk(4, b"b\nc\n", []))
    assert lines.line_end == 8
    resumed = TimedLines()  # reading again from there gives the lines after it only
    assert resumed.feed(chunk(2, b"bbb\nc\n", [])) == [(None, "bbb"), (None, "c")]
    assert resumed.line_end == 8


def test_output_and_events_merge_in_time_order_output_first_on_a_tie() -> None:
    out = io.StringIO()

    def entry(at: float | None, text: str) -> dict[str, object]:
        return {"ts": at, "message": text}

    merger = Merger(out, entry)
    merger.add_events([ev("failed", time=T0 + 2), ev("running", old="pending", time=T0)])
    merger.lines([(T0, "first"), (T0 + 1, "second"), (T0 + 2, "last")])
    merger.drain()
    messages = [json.loads(line)["message"] for line in out.getvalue().splitlines()]
    assert messages == ["first", "pending -> running", "second", "last", "running -> failed"]
