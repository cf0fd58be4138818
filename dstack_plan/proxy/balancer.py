"""Which replica gets the next request: least connections, ties broken round-robin.

Least connections (fewest requests in flight) suits LLM services, whose requests differ in
length by orders of magnitude: a replica busy with a long generation gets fewer new ones,
where plain round-robin would queue behind it. When several replicas tie (always, under
light load), a rotating cursor spreads requests across them in turn, so an idle service
still uses every replica. Pure and deterministic: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


class Balancer:
    """Replicas in a fixed order, each up or down with a count of requests in flight.

    A replica starts down: it takes traffic only once marked up (by its health checks).
    """

    def __init__(self, replica_ids: Iterable[str] = ()) -> None:
        self._order: list[str] = []
        self._up: set[str] = set()
        self._in_flight: dict[str, int] = {}
        self._cursor = 0
        self.set_replicas(replica_ids)

    def set_replicas(self, replica_ids: Iterable[str]) -> None:
        """Replace the set of replicas, keeping the state of those that stay."""
        order = list(dict.fromkeys(replica_ids))
        keep = set(order)
        self._order = order
        self._up &= keep
        # requests in flight on a removed replica finish on their own; forget the count
        self._in_flight = {r: self._in_flight.get(r, 0) for r in order}
        self._cursor = self._cursor % len(order) if order else 0

    @property
    def replicas(self) -> list[str]:
        return list(self._order)

    def healthy(self) -> list[str]:
        return [r for r in self._order if r in self._up]

    def is_up(self, replica_id: str) -> bool:
        return replica_id in self._up

    def mark_up(self, replica_id: str) -> None:
        if replica_id in self._in_flight:
            self._up.add(replica_id)

    def mark_down(self, replica_id: str) -> None:
        self._up.discard(replica_id)

    def in_flight(self, replica_id: str) -> int:
        return self._in_flight.get(replica_id, 0)

    def pick(self, exclude: Collection[str] = ()) -> str | None:
        """The healthy replica (not in `exclude`) with the fewest requests in flight; among
        equals, the first at or after the cursor, which then moves past it. None if none."""
        best: str | None = None
        best_index = 0
        count = len(self._order)
        for step in range(count):
            index = (self._cursor + step) % count
            replica = self._order[index]
            if replica not in self._up or replica in exclude:
                continue
            if best is None or self._in_flight[replica] < self._in_flight[best]:
                best, best_index = replica, index
        if best is not None:
            self._cursor = (best_index + 1) % count
        return best

    def acquire(self, replica_id: str) -> None:
        """A request was sent to `replica_id`."""
        if replica_id in self._in_flight:
            self._in_flight[replica_id] += 1

    def release(self, replica_id: str) -> None:
        """A request to `replica_id` has finished (whatever its outcome)."""
        if self._in_flight.get(replica_id, 0) > 0:
            self._in_flight[replica_id] -= 1
