"""When a run that waits for room may start: from what runs now and the queue ahead. Pure.

Each job that holds GPUs ends at the latest when its `max_duration` does (its start plus the
limit); one without a limit may hold its GPUs for ever, so a start that needs them is unknown.
The runs queued ahead are served first, each as soon as one host has room for it, holding it
for its own `max_duration` (for ever without one). The estimate is the earliest time one host
has the run's GPUs free from then on: an upper bound (jobs often end before their limit),
never a promise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

EPSILON = 1e-9
UNKNOWN = "unknown: runs ahead have no max_duration"


class Freeing(NamedTuple):
    """GPUs a running job gives back on `host` at `at` (None: no max_duration)."""

    host: str
    gpus: float
    at: float | None


class Ahead(NamedTuple):
    """A run queued before this one: the GPUs its job needs on one host, and how long it
    holds them (None: no max_duration)."""

    gpus: float
    duration: float | None


class Estimate(NamedTuple):
    at: float | None
    """Epoch seconds; None when not known (`why` says why)."""
    why: str


def earliest_start(
    need: float,
    free: Mapping[str, float],
    freeing: Sequence[Freeing],
    ahead: Sequence[Ahead],
    now: float,
) -> Estimate:
    """The earliest time some host has `need` GPUs free for good (see the module doc).

    `free`: each candidate host's free GPUs now; `freeing`: what running jobs give back."""
    events: dict[str, list[tuple[float, float]]] = {h: [] for h in free}
    unknown = {h: 0.0 for h in free}
    for f in freeing:
        if f.host not in events:
            continue
        if f.at is None:
            unknown[f.host] += f.gpus
        else:
            events[f.host].append((max(f.at, now), f.gpus))
    for run in ahead:
        found = _first_fit(run.gpus, free, events, now)
        if found is None:
            continue  # it waits for ever itself: it takes nothing known from this run
        host, start = found
        events[host].append((start, -run.gpus))
        if run.duration is None:
            unknown[host] += run.gpus  # it gives them back, but when is not known
        else:
            events[host].append((start + run.duration, run.gpus))
    found = _first_fit(need, free, events, now)
    if found is not None:
        return Estimate(found[1], "")
    # would it fit once the jobs without a max_duration ended? then only they are unknown
    if_ended = {h: [*e, (now, unknown[h])] for h, e in events.items()}
    if _first_fit(need, free, if_ended, now) is not None:
        return Estimate(None, UNKNOWN)
    return Estimate(None, "unknown: the hosts never free that much")


def _first_fit(
    need: float,
    free: Mapping[str, float],
    events: Mapping[str, list[tuple[float, float]]],
    now: float,
) -> tuple[str, float] | None:
    """(host, time) of the earliest moment one host has `need` free from then on."""
    best: tuple[float, str] | None = None
    for host, changes in events.items():
        at_once: dict[float, float] = {}
        for at, delta in changes:  # what happens at one moment counts together
            at_once[at] = at_once.get(at, 0.0) + delta
        level = free[host] + at_once.pop(now, 0.0)
        points = [(now, level)]
        for at in sorted(at_once):
            level += at_once[at]
            points.append((at, level))
        # the earliest point after which the level never drops below `need`
        start = None
        for index in range(len(points) - 1, -1, -1):
            at, level = points[index]
            if level < need - EPSILON:
                break
            start = at
        if start is not None and (best is None or (start, host) < best):
            best = (start, host)
    return None if best is None else (best[1], best[0])
