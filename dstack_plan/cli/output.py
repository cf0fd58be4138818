"""Printing to the terminal: consoles, tables, errors, JSON, and the styled lines of
`dstack_plan.plan.lines` (`Line`, `Part`, `styled`).

Tables are printed through `print_table` (or shown live as `whole_rows(table)`), the one
place that decides their width: whole rows on a pipe, whole words and addresses on a
terminal."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from dstack_plan.errors import ConfigError, DstackPlanError, shown
from dstack_plan.plan.lines import Line


def _no_color() -> bool:
    return bool(os.environ.get("NO_COLOR"))


def console(stderr: bool = False):  # noqa: ANN201 - rich is imported lazily
    from rich.console import Console

    # emoji=False: user text such as `echo :rocket:` is shown as written
    return Console(
        stderr=stderr, no_color=_no_color(), highlight=False, soft_wrap=True, emoji=False
    )


UNBOUNDED = 1_000_000
"""The width a table is laid out in when stdout is no terminal: its natural width."""


def print_table(renderable: Any) -> None:
    """Print a rich table (or a `Group` of tables and lines) on stdout, as `whole_rows`."""
    console().print(whole_rows(renderable))


def whole_rows(renderable: Any) -> Any:
    """`renderable` (a rich `Table`, or a `Group` holding tables and lines) laid out so that
    no cell is cut: what every table the CLI prints goes through (`Live.update` takes it too).

    Not on a terminal (a pipe, a file): every row on one line at the table's natural width,
    whatever COLUMNS says, as `kubectl get` and `docker ps` print; trailing blanks dropped.
    On a terminal: within the console's width (COLUMNS when set), each column at least as
    wide as its widest cell when it does not wrap (`no_wrap`: names, statuses, addresses)
    or as its longest word when it does (between words); when even that does not fit, the
    table is wider than the terminal rather than cut (a live view crops it at the edge).
    """
    return _WholeRows(renderable)


class _WholeRows:
    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.console import Group
        from rich.segment import Segment
        from rich.table import Table

        terminal = _is_tty(console.file)
        wide = options.update_width(UNBOUNDED)
        group = self.renderable
        parts = group.renderables if isinstance(group, Group) else [group]
        for part in parts:
            if not terminal:
                rendered = console.render(part, wide)
            elif isinstance(part, Table):
                width = _fit_columns(part, console, wide, options.max_width)
                rendered = console.render(part, options.update_width(width))
            else:
                rendered = console.render(part, options)
            for line, ends in Segment.split_lines_terminator(rendered):
                yield from _rstrip(line)
                if ends:
                    yield Segment.line()


def _fit_columns(table: Any, console: Any, wide: Any, width: int) -> int:
    """Fix the widths of `table`'s columns so that its cells stay whole within `width`
    (see `whole_rows`); return the width to render it at (more than `width` when the
    narrowest such layout is wider)."""
    from rich.measure import Measurement

    least: list[int] = []
    most: list[int] = []
    for column in table.columns:
        sizes = [Measurement.get(console, wide, c) for c in (column.header, *column.cells)]
        most.append(max(size.maximum for size in sizes))
        least.append(most[-1] if column.no_wrap else max(size.minimum for size in sizes))
    natural = Measurement.get(console, wide, table).maximum
    room = width - (natural - sum(most))  # less what padding and borders take
    if sum(most) <= room:
        return width
    widths = list(least)
    spare = max(0, room - sum(least))
    slack = [high - low for high, low in zip(most, least, strict=True)]
    if spare:  # to the columns that wrap, in proportion to what wrapping costs each
        widths = [w + s * spare // sum(slack) for w, s in zip(widths, slack, strict=True)]
        for i in range(len(widths)):
            if sum(widths) - sum(least) >= spare:
                break
            widths[i] += 1 if widths[i] < most[i] else 0
    for column, fixed in zip(table.columns, widths, strict=True):
        column.width = fixed
    return max(width, natural - sum(most) + sum(widths))


def _rstrip(line: list[Any]) -> list[Any]:
    """A rendered line without its trailing blanks (the padding of its last cell)."""
    from rich.segment import Segment

    while line and not line[-1].control and not line[-1].text.rstrip():
        line.pop()
    if line and not line[-1].control:
        last = line[-1]
        line[-1] = Segment(last.text.rstrip(), last.style, last.control)
    return line


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def print_error(error: DstackPlanError) -> None:
    """A user error: the message only, never a traceback."""
    if isinstance(error, ConfigError):
        for issue in error.issues:
            sys.stderr.write(f"{issue}\n")
        return
    sys.stderr.write(f"Error: {shown(str(error), keep_newlines=True)}\n")


def print_bug() -> None:
    sys.stderr.write(
        "Error: an internal error occurred; this is a bug in dstack-plan, please report it.\n"
    )
    if os.environ.get("DSTACK_PLAN_DEBUG"):
        traceback.print_exc()
    else:
        exc = sys.exc_info()[1]
        sys.stderr.write(
            f"  {type(exc).__name__}: {exc}\n  (run with --debug for the traceback)\n"
        )


def notice(text: str, *, event: str, warning: bool = False) -> None:
    """Tell the user something beside the command's output, on stderr: as a log record
    (`event`) when logging was asked for (`--log-level`, `--log-format json`: every stderr
    line then has the format asked for), else as a line (`Warning: ` first for a warning)."""
    if logging.getLogger().handlers:
        level = logging.WARNING if warning else logging.INFO
        logging.getLogger("dstack_plan.cli").log(level, "%s", text, extra={"event": event})
        return
    if warning:
        sys.stderr.write(f"Warning: {text}\n")
        return
    from dstack_plan.plan.lines import styled

    print_lines([(styled(text, "dim"),)], stderr=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def print_lines(lines: Iterable[Line], stderr: bool = False) -> None:
    """Print lines, styled on a terminal and plain otherwise (--no-color, NO_COLOR, a pipe)."""
    stream = sys.stderr if stderr else sys.stdout
    if _plain(stream):  # no console to build (~30 ms of every start), no rich at all
        stream.write("".join(f"{plain_text(line)}\n" for line in lines))
        return
    from rich.text import Text

    out = console(stderr=stderr)
    for line in lines:
        out.print(Text(line) if isinstance(line, str) else Text.assemble(*line))


def plain_text(line: Line) -> str:
    """The text of a line without its styles."""
    if isinstance(line, str):
        return line
    return "".join(part if isinstance(part, str) else part[0] for part in line)


def _plain(stream: Any) -> bool:
    """No styles: colours are off, or the output is no terminal and colour is not forced."""
    if _no_color():
        return True
    if os.environ.get("FORCE_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return not (isatty is not None and isatty())


def progress(message: str) -> AbstractContextManager[object]:
    """A spinner on stderr while slow work runs; nothing when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return nullcontext()
    return console(stderr=True).status(message)
