"""How long a cloud machine may stay idle before watch releases it (reference §3.6).

A machine added for a run (bursting) gets the shorter of its fleet's `idle_duration` and the
run's; any other machine has the fleet's. Unset durations default as dstack's do: 3d for a
fleet, 5m for a run. `off` never releases.
"""

from __future__ import annotations

from typing import Literal

FLEET_IDLE_S = 3 * 24 * 3600
"""A fleet's `idle_duration` when it sets none (dstack's 3d)."""
RUN_IDLE_S = 300
"""A run's `idle_duration` when it sets none (dstack's 5m)."""

IdleDuration = int | Literal["off"] | None
"""Seconds, `off`, or None for the default."""


def burst_idle(fleet: IdleDuration, run: IdleDuration) -> int | Literal["off"]:
    """A machine added for a run: the shorter of the fleet's and the run's (each defaulted);
    `off` only when both are."""
    limits = [
        v for v in (or_default(fleet, FLEET_IDLE_S), or_default(run, RUN_IDLE_S)) if v != "off"
    ]
    return min(limits) if limits else "off"


def idle_limit(machine: IdleDuration, fleet: IdleDuration) -> int | Literal["off"]:
    """How long a machine may stay idle: its own (set when a run burst to it), else the
    fleet's."""
    return or_default(machine, or_default(fleet, FLEET_IDLE_S))


def or_default(value: IdleDuration, default: int | Literal["off"]) -> int | Literal["off"]:
    return default if value is None else value
