"""How many replicas a service's request rate asks for, dstack's rules: enough replicas that
each gets about `scaling.target` requests per second over `scaling.window`, within the
`replicas` range. A change waits `scale_up_delay` (up) or `scale_down_delay` (down) from the
last change, so a burst does not flap the count, except from zero: a request waiting for a
service with no replica starts one at once. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dstack_plan.config.service_fields import Scaling


@dataclass(frozen=True)
class Load:
    """What the proxy measured for one service."""

    rps: float
    """Requests per second over `scaling.window`."""
    in_flight: int
    """Requests in flight now, those waiting for a replica included."""
    observed_for: float
    """Seconds the proxy has been counting (a rate over a shorter time is not yet known)."""


@dataclass(frozen=True)
class Decision:
    desired: int
    wanted: int
    """What the rate alone asks for, within the range."""
    held_by: str | None = None
    """What keeps `desired` from `wanted`: `scale_up_delay`, `scale_down_delay`, or
    `window` (the proxy has counted for less than one window)."""
    held_until: float | None = None
    """When the delay that holds it ends (epoch seconds)."""


def decide(
    scaling: Scaling,
    bounds: tuple[int, int],
    current: int,
    load: Load,
    scaled_at: float,
    now: float,
) -> Decision:
    """The replicas a service with `current` desired replicas (last changed at `scaled_at`)
    should have now."""
    low, high = bounds
    asked = math.ceil(round(load.rps / scaling.target, 6))
    if load.in_flight > 0:
        asked = max(asked, 1)
    wanted = min(max(asked, low), high)
    if wanted == current or (wanted > current and current == 0):
        return Decision(wanted, wanted)
    if wanted > current:
        held, until = "scale_up_delay", scaled_at + float(scaling.scale_up_delay)
    elif load.observed_for < scaling.window:
        held, until = "window", now - load.observed_for + scaling.window
    else:
        held, until = "scale_down_delay", scaled_at + float(scaling.scale_down_delay)
    if now < until:
        return Decision(current, wanted, held, until)
    return Decision(wanted, wanted)
