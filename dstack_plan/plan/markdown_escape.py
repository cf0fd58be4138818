"""Escaping for the markdown plan: text that cannot become markup, code spans and fences
that hold any text."""

from __future__ import annotations

import re


def longest_backtick_run(lines: list[str]) -> int:
    """The longest run of backticks in `lines`: a fence or code span must be longer."""
    return max((len(m) for line in lines for m in re.findall(r"`+", line)), default=0)


_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~])")


def text(value: str) -> str:
    """Free text (reasons, notes, messages) safe in a table cell: no markup, no HTML."""
    return _SPECIAL.sub(r"\\\1", " ".join(str(value).split()))


def code(value: str) -> str:
    """An inline code span that holds any text (backticks and pipes too)."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    ticks = "`" * (longest_backtick_run([text]) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def html(value: str) -> str:
    """`value` as HTML text (inside `<summary>`)."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
