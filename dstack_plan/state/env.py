"""Settings of the state package read from the environment: durations in seconds."""

from __future__ import annotations

import math
import os
import re

from dstack_plan.errors import StateError

_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", re.ASCII | re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_seconds(text: str) -> float | None:
    """`20`, `2.5`, `20s`, `500ms`, `5m`, `1h` in seconds; None when it is none of those."""
    match = _DURATION.fullmatch(text)
    if match is None:
        return None
    seconds = float(match[1]) * _UNIT_SECONDS[(match[2] or "s").lower()]
    return seconds if math.isfinite(seconds) else None


def env_seconds(name: str, default: float) -> float:
    """The positive duration the environment variable `name` sets, else `default`.

    StateError naming the variable when it is set to anything else, so a typo is not
    silently replaced by the default.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    seconds = parse_seconds(raw)
    if seconds is None or seconds <= 0:
        raise StateError(
            f"{name}={raw!r}: expected a positive duration: seconds (20, 2.5) or a number"
            " with unit ms, s, m or h (500ms, 20s, 5m)"
        )
    return seconds


def format_seconds(seconds: float) -> str:
    """A duration for messages: `3s`, `2.5s`, `4m10s`, `1h2m`."""
    if seconds < 60:
        text = f"{seconds:.1f}".removesuffix(".0")
        return f"{text}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m{secs}s" if secs else f"{minutes}m"
