"""What a `dstack watch --metrics-file PATH` process says about itself, read from that file
(rewritten atomically after every tick): how many ticks it finished, and whether it led in
the last one. Tests count ticks instead of timing them."""

from __future__ import annotations

import re
from pathlib import Path

_TICKS = re.compile(r"^dstack_reconcile_duration_seconds_count (\S+)$", re.M)
_LEADER = re.compile(r"^dstack_watch_leader (\S+)$", re.M)


def _read(metrics: Path) -> str:
    try:
        return metrics.read_text()
    except OSError:
        return ""


def ticks_done(metrics: Path) -> int:
    """How many ticks the watch process finished (0 before its first)."""
    found = _TICKS.search(_read(metrics))
    return int(float(found.group(1))) if found else 0


def last_tick(metrics: Path) -> tuple[int, bool]:
    """(ticks finished, whether it held the leader lease in the last of them), read at once."""
    text = _read(metrics)
    ticks, leader = _TICKS.search(text), _LEADER.search(text)
    return (
        int(float(ticks.group(1))) if ticks else 0,
        leader is not None and float(leader.group(1)) == 1.0,
    )
