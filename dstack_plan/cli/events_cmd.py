"""`dstack events`: the status changes `dstack watch` recorded, oldest first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.clock import Clock
    from dstack_plan.state.events import Event, EventLog


def events(
    directory: Path = common.DirArg,
    state: str = common.StateOpt,
    since: str = typer.Option(
        None, "--since", help="Only events from then on: 1h, 10m, or an RFC 3339 time."
    ),
    follow: bool = typer.Option(
        False, "-f", "--follow", help="Keep printing new events until Ctrl-C."
    ),
    as_json: bool = common.JsonOpt,
) -> None:
    """Print the event log: `TIME  ADDRESS  JOB  STATUS  REASON`, STATUS as `old -> new`.

    The log keeps the last 10,000 events, beside the state (`.dstack/events.jsonl`).
    --json prints one object a line: {time, address, kind, span_id, old_status, new_status,
    job_id, reason}. --follow keeps printing events as watch records them until Ctrl-C
    (exit 0). Nothing is written.
    """
    from dstack_plan.clock import SystemClock
    from dstack_plan.inspect.events import open_event_log
    from dstack_plan.inspect.logs import parse_since

    common.require_directory(directory)
    clock = SystemClock()
    cutoff = parse_since(since, clock.now()) if since else None
    log = open_event_log(directory, state)
    if not follow:
        _print_batch(log.read(since=cutoff), as_json, cutoff, None)
        return
    import asyncio

    try:
        asyncio.run(_follow(log, cutoff, as_json, clock))
    except KeyboardInterrupt:  # how a user stops following: not an error
        return


async def _follow(log: EventLog, cutoff: float | None, as_json: bool, clock: Clock) -> None:
    from dstack_plan.inspect.events import FOLLOW_WIDTHS, HEADERS, no_events_line, table_lines

    header_shown = as_json  # JSON lines have no header
    async for batch in log.follow_batches(cutoff, clock):
        if not batch:  # only the first batch can be empty: nothing recorded yet
            if not as_json:
                _write([f"{no_events_line(cutoff)} Waiting for new ones (Ctrl-C to stop)."])
            continue
        if not header_shown:
            _write(table_lines([HEADERS], FOLLOW_WIDTHS))
            header_shown = True
        _print_batch(batch, as_json, cutoff, FOLLOW_WIDTHS, header=False)


def _print_batch(
    events: list[Event],
    as_json: bool,
    cutoff: float | None,
    widths: tuple[int, ...] | None,
    *,
    header: bool = True,
) -> None:
    from dstack_plan.inspect.events import (
        HEADERS,
        event_json,
        event_row,
        no_events_line,
        table_lines,
    )

    if as_json:
        _write([event_json(e) for e in events])
    elif not events:
        _write([no_events_line(cutoff)])
    else:
        rows: list[tuple[str, ...]] = [event_row(e) for e in events]
        _write(table_lines([HEADERS, *rows] if header else rows, widths))


def _write(lines: list[str]) -> None:
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()
