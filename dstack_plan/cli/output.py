"""Printing to the terminal: consoles, errors, JSON, and the styled lines of
`dstack_plan.plan.lines` (`Line`, `Part`, `styled`)."""

from __future__ import annotations

import json
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
