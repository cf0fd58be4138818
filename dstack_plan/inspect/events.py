"""`dstack events`: the event log of a project's state, as table rows or JSON lines.

Reads only: the log is written by `dstack watch` (see `state/events.py`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from dstack_plan.state.events import Event, EventLog
from dstack_plan.state.select import open_backend

HEADERS = ("TIME", "ADDRESS", "JOB", "STATUS", "REASON")
FOLLOW_WIDTHS = (20, 24, 28, 26, 0)
"""Column widths when following: rows arrive one by one, so they cannot be measured first."""


def open_event_log(directory: str | Path, state: str | Path | None = None) -> EventLog:
    """The event log beside the state of the project in `directory` (or of `state`)."""
    return EventLog(open_backend(directory, state))


def format_time(epoch: float) -> str:
    """RFC 3339 in UTC to the second (`2026-12-01T13:17:49Z`): what `--since` accepts."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_row(event: Event) -> tuple[str, str, str, str, str]:
    """The cells of `event` under HEADERS; STATUS is `old -> new` (`- -> new` when first seen)."""
    return (
        format_time(event.time),
        event.address,
        event.job_id or "-",
        f"{event.old_status or '-'} -> {event.new_status}",
        event.reason or "",
    )


def table_lines(rows: list[tuple[str, ...]], widths: tuple[int, ...] | None = None) -> list[str]:
    """`rows` as aligned plain-text lines; each column at least `widths` wide, or as wide as
    its widest cell when None. The last column is never padded."""
    if widths is None:
        widths = tuple(max(len(row[i]) for row in rows) for i in range(len(rows[0])))
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def event_json(event: Event) -> str:
    """One line of `--json` output: {time, address, kind, span_id, old_status, new_status,
    job_id, reason, host}."""
    return event.model_dump_json()


def no_events_line(since: float | None) -> str:
    """What an empty result says."""
    if since is not None:
        return f"No events since {format_time(since)}."
    return "No events. (dstack watch records status changes here as it sees them.)"
