"""Lines of text with styles, as the plan's human rendering (`plan.render`) produces them, the
CLI prints them (`cli.output.print_lines`) and the web UI shows them (styles as CSS classes)."""

from __future__ import annotations

Part = str | tuple[str, str]
"""Text as it is, or `(text, style)` with a rich style such as `"bold red"`."""
Line = str | tuple[Part, ...]
"""One line of output: plain text, or parts printed one after the other. Text is never
parsed as markup, so user text (a command, an error message) is shown exactly as written."""


def styled(text: str, style: str) -> tuple[str, str]:
    """A part of a line in `style` (dropped when colours are off or output is piped)."""
    return (text, style)
