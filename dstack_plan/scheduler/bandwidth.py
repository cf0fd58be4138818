"""Choosing a gang's hosts by the bandwidth measured between them. Pure.

`best_gang(candidates, size, bandwidth)` picks `size` distinct hosts among `candidates`
maximising the minimum pairwise bandwidth (the slowest link bounds a collective such as an
all-reduce), then the sum over all pairs, then the caller's order of `candidates` (so equal
inputs give equal answers, and the caller's own preference, such as packing, decides among
equally connected sets). A link is symmetric: the lower of the directions measured, unknown
when none was (never probed, or the probe failed): unknown ranks below every measured value.

Rates within a factor of `1 + tolerance` of each other (1.5 by default) count as equal: a
0.5 s probe between busy hosts varies by tens of percent from one run to the next, and that
noise must not override the caller's preference, while the differences that matter (a 10 vs a
25 or 100 Gbit/s link, a congested switch) are factors of two and more. Rates are grouped from
the fastest down, each group anchored on its fastest rate, so two rates a hair apart never
land in different groups by where a fixed bucket boundary happens to fall.

Exact (every combination) while there are at most `EXACT_LIMIT` combinations; beyond that
greedy: from each of the best-linked pairs, add the host that keeps the minimum highest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import NamedTuple

EXACT_LIMIT = 20_000
"""Most combinations tried exhaustively (C(20, 4) = 4845; C(30, 4) = 27405 goes greedy)."""
GREEDY_SEEDS = 32
"""How many of the best-linked pairs the greedy search starts from."""
UNKNOWN = -1
"""The level of an unknown link: below every measured one."""


class GangChoice(NamedTuple):
    """The hosts chosen for a gang, and what links them."""

    hosts: tuple[str, ...]
    """In the order of `candidates`."""
    min_bytes_per_second: float | None
    """The slowest link between them; None when one of the links is unknown (or size 1)."""
    exact: bool
    """Every combination was compared (else the greedy search chose)."""


def best_gang(
    candidates: Sequence[str],
    size: int,
    bandwidth: Mapping[tuple[str, str], float],
    *,
    tolerance: float = 0.5,
) -> GangChoice | None:
    """The best `size` distinct hosts of `candidates` for a gang, by the measured
    `bandwidth` ((src, dst) -> bytes per second, as `BandwidthRecord.matrix()` gives it);
    None when there are fewer than `size` distinct candidates. Deterministic."""
    hosts = list(dict.fromkeys(candidates))
    if size <= 0 or len(hosts) < size:
        return None
    if size == 1:
        return GangChoice((hosts[0],), None, True)
    rates = _symmetric(bandwidth)
    levels = _Levels(hosts, rates, tolerance)
    n = len(hosts)
    if math.comb(n, size) <= EXACT_LIMIT:
        chosen = _exact(levels, n, size)
        exact = True
    else:
        chosen = _greedy(levels, n, size)
        exact = False
    picked = tuple(hosts[i] for i in chosen)
    links = [rates.get((a, b) if a < b else (b, a)) for a, b in combinations(picked, 2)]
    known = [x for x in links if x is not None]
    slowest = min(known) if len(known) == len(links) else None
    return GangChoice(picked, slowest, exact)


class _Levels:
    """Each measured link's rate as a level between candidate indices: rates sorted from the
    fastest, a new (lower) level starting where a rate falls below the current level's
    fastest divided by 1 + tolerance. Only measured links are stored, so a large fleet costs
    what it has; every level is above UNKNOWN."""

    def __init__(
        self, hosts: Sequence[str], rates: Mapping[tuple[str, str], float], tolerance: float
    ):
        index = {h: i for i, h in enumerate(hosts)}
        links: dict[tuple[int, int], float] = {}
        for (a, b), rate in rates.items():
            if a in index and b in index and rate > 0:
                i, j = sorted((index[a], index[b]))
                links[(i, j)] = rate
        group_of: dict[float, int] = {}
        groups = 0
        anchor = math.inf
        for rate in sorted(set(links.values()), reverse=True):
            if rate * (1 + max(tolerance, 0.0)) < anchor:
                groups += 1
                anchor = rate
            group_of[rate] = groups
        # the fastest group gets the highest level; the slowest is level 0
        self.known: dict[tuple[int, int], int] = {
            pair: groups - group_of[rate] for pair, rate in links.items()
        }

    def __call__(self, i: int, j: int) -> int:
        return self.known.get((i, j) if i < j else (j, i), UNKNOWN)


def _symmetric(bandwidth: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """(a, b) with a < b -> the lower of the rates measured either way."""
    out: dict[tuple[str, str], float] = {}
    for (src, dst), rate in bandwidth.items():
        if src == dst or rate is None or math.isnan(rate):
            continue
        key = (src, dst) if src < dst else (dst, src)
        out[key] = min(rate, out.get(key, rate))
    return out


def _score(levels: _Levels, chosen: Sequence[int]) -> tuple[int, int]:
    pairs = [levels(a, b) for a, b in combinations(chosen, 2)]
    return min(pairs), sum(pairs)


def _exact(levels: _Levels, n: int, size: int) -> tuple[int, ...]:
    """The best combination; the first in candidate order among equals."""
    best: tuple[int, ...] = tuple(range(size))
    best_score = _score(levels, best)
    for chosen in combinations(range(n), size):
        score = _score(levels, chosen)
        if score > best_score:
            best, best_score = chosen, score
    return best


def _greedy(levels: _Levels, n: int, size: int) -> tuple[int, ...]:
    """From each of the GREEDY_SEEDS best measured pairs (or the first two candidates when
    none is measured), grow the set one host at a time, taking the one whose weakest link to
    the set is strongest (then the strongest total, then the first candidate); the best set
    found wins, the first in candidate order among equals."""
    seeds = sorted(levels.known, key=lambda p: (-levels.known[p], p))[:GREEDY_SEEDS]
    best: tuple[int, ...] = tuple(range(size))
    best_score = _score(levels, best)
    for seed in seeds or [(0, 1)]:
        chosen = list(seed)
        weakest = [min(levels(i, seed[0]), levels(i, seed[1])) for i in range(n)]
        total = [levels(i, seed[0]) + levels(i, seed[1]) for i in range(n)]
        while len(chosen) < size:
            taken = set(chosen)
            pick = max(
                (i for i in range(n) if i not in taken), key=lambda i: (weakest[i], total[i], -i)
            )
            chosen.append(pick)
            for i in range(n):
                link = levels(i, pick)
                weakest[i] = min(weakest[i], link)
                total[i] += link
        ordered = tuple(sorted(chosen))
        score = _score(levels, ordered)
        if score > best_score or (score == best_score and ordered < best):
            best, best_score = ordered, score
    return best
