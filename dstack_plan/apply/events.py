"""Progress events of an apply, and the Terraform-like wording the CLI prints for them.

The engine prints nothing: it calls `on_event(address, phase, message)` and the CLI renders
`f"{address}: {message}"` (run-wide events have address "").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

logger = logging.getLogger(__name__)

Phase = Literal["start", "done", "failed", "skipped", "interrupt", "abort"]
"""`start`/`done` bracket each provider operation (a replace has two pairs); `failed` and
`skipped` end a resource; `interrupt` and `abort` are run-wide (address "")."""

EventCallback = Callable[[str, str, str], None]
"""`on_event(address, phase, message)`; `phase` is one of `Phase`."""

Step = Literal["create", "update", "delete"]
"""A provider operation; a replace is a `delete` and a `create`."""

_STARTING: dict[str, str] = {
    "create": "Creating...",
    "update": "Modifying...",
    "delete": "Destroying...",
}
_COMPLETE: dict[str, str] = {
    "create": "Creation complete",
    "update": "Modifications complete",
    "delete": "Destruction complete",
}


def format_duration(seconds: float) -> str:
    """`2s`, `1m5s`, `2h0m3s`: Terraform's style, whole seconds."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def starting_message(step: Step, *, deposed: bool = False) -> str:
    """`Creating...`, `Modifying...`, `Destroying...` (`Destroying deposed object...`)."""
    if deposed:
        return "Destroying deposed object..."
    return _STARTING[step]


def complete_message(step: Step, seconds: float, *, deposed: bool = False) -> str:
    """`Creation complete after 2s` and the like."""
    what = "Destruction of deposed object complete" if deposed else _COMPLETE[step]
    return f"{what} after {format_duration(seconds)}"


def plural(count: int, noun: str) -> str:
    """`1 operation`, `3 operations`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def safe_emitter(on_event: EventCallback | None) -> EventCallback:
    """Wrap the caller's callback so a rendering bug cannot break an apply half-way."""

    def emit(address: str, phase: str, message: str) -> None:
        if on_event is None:
            return
        try:
            on_event(address, phase, message)
        except Exception:  # the apply must go on: state commits matter more than output
            logger.warning("on_event callback failed for %s %s", address, phase, exc_info=True)

    return emit
