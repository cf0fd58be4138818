"""Choosing a gang's hosts by the bandwidth measured between them. Pure.

`best_gang(candidates, size, bandwidth)` picks `size` distinct hosts among `candidates`
maximising the minimum pairwise bandwidth (the slowest link bounds a collective such as an
all-reduce), then the sum over all pairs, then the caller's order of `candidates` (so equal
inputs give equal answers, and the caller's own preference, such as packing, decides among
equally connected sets). A link is symmetric: the lower of the directions measured.

The matrix is sparse: fleet apply measures about one link per host (`fleets/apply_probe.py`),
only `dstack fleet probe` measures every pair. A pair with no measurement is *estimated* from
its hosts' own measured links: the lower of the two hosts' fastest measured link (to any host
of the matrix, a candidate or not). A host's NIC bounds every link it has, so this is an upper
bound, exact when the NICs are what limits (a switch in between may make the link slower): an
estimate ranks just below a measured link in the same tolerance group, and above any slower
group. A pair stays unknown (ranked below every measured or estimated value) when one of its
hosts has no measured link, or when it was probed and failed (`LinkMatrix.unknown`: a host
that cannot reach another must not be estimated as if it could).

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
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import NamedTuple

EXACT_LIMIT = 20_000
"""Most combinations tried exhaustively (C(20, 4) = 4845; C(30, 4) = 27405 goes greedy)."""
GREEDY_SEEDS = 32
"""How many of the best-linked pairs the greedy search starts from."""
UNKNOWN = -1
"""The level of an unknown link: below every measured or estimated one."""

Pair = tuple[str, str]


class LinkMatrix(dict[Pair, float]):
    """The measured links, (src, dst) -> bytes per second (a plain dict of them), and the
    pairs that were probed without a result (`unknown`, either direction): what
    `BandwidthRecord.matrix()` gives. A plain mapping passed to `best_gang` has no failed
    pairs: every pair it lacks may be estimated."""

    def __init__(self, rates: Mapping[Pair, float] | None = None, unknown: Iterable[Pair] = ()):
        super().__init__(rates or {})
        self.unknown: frozenset[Pair] = frozenset(unknown)


class GangChoice(NamedTuple):
    """The hosts chosen for a gang, and what links them."""

    hosts: tuple[str, ...]
    """In the order of `candidates`."""
    min_bytes_per_second: float | None
    """The slowest link between them, measured or estimated (see `estimated`); None when one
    of the links is unknown (or size 1)."""
    exact: bool
    """Every combination was compared (else the greedy search chose)."""
    estimated: bool = False
    """Some link between them was not measured but estimated from its hosts' other links:
    `min_bytes_per_second` is then an upper bound."""


def best_gang(
    candidates: Sequence[str],
    size: int,
    bandwidth: Mapping[Pair, float],
    *,
    tolerance: float = 0.5,
) -> GangChoice | None:
    """The best `size` distinct hosts of `candidates` for a gang, by the measured
    `bandwidth` ((src, dst) -> bytes per second, as `BandwidthRecord.matrix()` gives it: a
    `LinkMatrix`, whose failed pairs stay unknown) and the estimates drawn from it for the
    pairs it lacks; None when there are fewer than `size` distinct candidates. Deterministic."""
    hosts = list(dict.fromkeys(candidates))
    if size <= 0 or len(hosts) < size:
        return None
    if size == 1:
        return GangChoice((hosts[0],), None, True)
    links = _Links(bandwidth)
    levels = _Levels(hosts, links, tolerance)
    n = len(hosts)
    if math.comb(n, size) <= EXACT_LIMIT:
        chosen = _exact(levels, n, size)
        exact = True
    else:
        chosen = _greedy(levels, n, size)
        exact = False
    picked = tuple(hosts[i] for i in chosen)
    rated = [links.rate(a, b) for a, b in combinations(picked, 2)]
    known = [r for r in rated if r is not None]
    slowest = min(rate for rate, _ in known) if len(known) == len(rated) else None
    estimated = any(not measured for _, measured in known)
    return GangChoice(picked, slowest, exact, estimated)


class _Links:
    """The matrix made symmetric, each host's fastest measured link, and the pairs probed
    without a result: what a pair's rate, measured or estimated, is read from."""

    def __init__(self, bandwidth: Mapping[Pair, float]):
        rates = _symmetric(bandwidth)
        self.measured = {key: rate for key, rate in rates.items() if rate > 0}
        """(a, b) with a < b -> the lower of the rates measured either way."""
        self.best: dict[str, float] = {}
        """host -> its fastest measured link: its NIC is at least that fast, and bounds every
        other link it has."""
        for (a, b), rate in self.measured.items():
            for host in (a, b):
                self.best[host] = max(rate, self.best.get(host, rate))
        failed = bandwidth.unknown if isinstance(bandwidth, LinkMatrix) else frozenset()
        # nothing got through (a rate of 0) is no better than a probe that failed
        self.failed = {_key(a, b) for a, b in failed} - set(self.measured)
        self.failed |= {key for key, rate in rates.items() if rate <= 0}

    def rate(self, a: str, b: str) -> tuple[float, bool] | None:
        """(bytes per second, measured) of the pair; None when unknown."""
        key = _key(a, b)
        if key in self.measured:
            return self.measured[key], True
        if key in self.failed or a not in self.best or b not in self.best:
            return None
        return min(self.best[a], self.best[b]), False


class _Levels:
    """Each link's rate as a level between candidate indices: rates sorted from the fastest,
    a new (lower) group starting where a rate falls below the current group's fastest divided
    by 1 + tolerance. A measured link in group g is at level 2g + 1, an estimated one 2g (just
    below a measured link as fast: an estimate is only an upper bound), an unknown one UNKNOWN.
    Only measured links and each host's fastest are stored, so a large fleet costs what it
    has; estimates are worked out when asked."""

    def __init__(self, hosts: Sequence[str], links: _Links, tolerance: float):
        index = {h: i for i, h in enumerate(hosts)}
        measured: dict[tuple[int, int], float] = {}
        for (a, b), rate in links.measured.items():
            if a in index and b in index:
                i, j = sorted((index[a], index[b]))
                measured[(i, j)] = rate
        best = {index[h]: rate for h, rate in links.best.items() if h in index}
        group_of: dict[float, int] = {}
        groups = 0
        anchor = math.inf
        for rate in sorted({*measured.values(), *best.values()}, reverse=True):
            if rate * (1 + max(tolerance, 0.0)) < anchor:
                groups += 1
                anchor = rate
            group_of[rate] = groups
        # the fastest group gets the highest level; the slowest is group 0
        self.known: dict[tuple[int, int], int] = {
            pair: 2 * (groups - group_of[rate]) + 1 for pair, rate in measured.items()
        }
        self.top: list[int] = [
            groups - group_of[best[i]] if i in best else UNKNOWN for i in range(len(hosts))
        ]
        """Each candidate's fastest link's group (UNKNOWN: none measured)."""
        self.failed: set[tuple[int, int]] = set()
        """Candidate pairs probed without a result: unknown, never estimated."""
        for a, b in links.failed:
            if a in index and b in index:
                i, j = sorted((index[a], index[b]))
                self.failed.add((i, j))

    def __call__(self, i: int, j: int) -> int:
        key = (i, j) if i < j else (j, i)
        level = self.known.get(key)
        if level is not None:
            return level
        low = min(self.top[i], self.top[j])
        if low == UNKNOWN or key in self.failed:
            return UNKNOWN
        return 2 * low  # estimated: the slower of the two hosts' fastest links


def _key(a: str, b: str) -> Pair:
    return (a, b) if a < b else (b, a)


def _symmetric(bandwidth: Mapping[Pair, float]) -> dict[Pair, float]:
    """(a, b) with a < b -> the lower of the rates measured either way."""
    out: dict[Pair, float] = {}
    for (src, dst), rate in bandwidth.items():
        if src == dst or rate is None or math.isnan(rate):
            continue
        key = _key(src, dst)
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
    """From each of the GREEDY_SEEDS best measured pairs, and the pair of the two hosts with
    the fastest links of their own (the best estimate, for a matrix measured sparsely), grow
    the set one host at a time, taking the one whose weakest link to the set is strongest
    (then the strongest total, then the first candidate); the best set found wins, the first
    in candidate order among equals."""
    seeds = sorted(levels.known, key=lambda p: (-levels.known[p], p))[:GREEDY_SEEDS]
    tops = sorted(range(n), key=lambda i: (-levels.top[i], i))[:2]
    estimated = (min(tops), max(tops))
    if estimated not in seeds:
        seeds.append(estimated)
    best: tuple[int, ...] = tuple(range(size))
    best_score = _score(levels, best)
    for seed in seeds:
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
