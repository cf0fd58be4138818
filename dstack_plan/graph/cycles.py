"""Dependency cycles among declared resources, each named in order and found without state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from graphlib import CycleError, TopologicalSorter

MAX_CYCLES = 20
"""Report at most this many cycles at once; fixing those shows the rest."""


def find_cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Cycles in `address -> its dependencies`, each as `[a, b, ..., a]` read "a depends on b".

    Cycles are node-disjoint: after one is found its nodes are set aside and the rest is
    searched again, so every strongly connected tangle is reported once.
    """
    remaining = _tangled(edges)
    found: list[list[str]] = []
    while len(found) < MAX_CYCLES:
        try:
            TopologicalSorter(remaining).prepare()
        except CycleError as err:
            # graphlib lists the cycle dependency-first; "depends on" reads the other way
            cycle = list(reversed(err.args[1]))
            found.append(cycle)
            for address in cycle:
                remaining.pop(address, None)
            for deps in remaining.values():
                deps.difference_update(cycle)
            continue
        break
    return found


def _tangled(edges: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The part of the graph a topological sort cannot order: cycles and what waits on them.

    Kahn's algorithm over the plain edge maps is several times faster than graphlib on a large
    acyclic project, which is the common case; graphlib then names cycles in what is left.
    """
    dependencies = {address: set(deps) for address, deps in edges.items()}
    waiting = {address: len(deps) for address, deps in dependencies.items()}
    dependents: dict[str, list[str]] = {}
    for address, deps in dependencies.items():
        for dep in deps:
            dependents.setdefault(dep, []).append(address)
            waiting.setdefault(dep, 0)
    ready = [address for address, count in waiting.items() if count == 0]
    while ready:
        address = ready.pop()
        del waiting[address]
        for dependent in dependents.get(address, ()):
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
    return {address: dependencies.get(address, set()) & waiting.keys() for address in waiting}


def starting_at(cycle: list[str], first: str) -> list[str]:
    """The same cycle (`[a, b, a]`) read from `first`, one of its nodes."""
    ring = cycle[:-1]
    start = ring.index(first)
    ring = ring[start:] + ring[:start]
    return [*ring, ring[0]]
