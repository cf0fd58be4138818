"""Per-service request counts: what watch's autoscaler reads (`rps`) and in-flight counts.

A request is counted when it arrives for a service and passes auth, before a replica is
chosen: a request waiting for a replica of a service scaled to zero counts, which is what
lets the autoscaler see demand for a service with no replicas.
"""

from __future__ import annotations

import collections

from dstack_plan.clock import Clock, SystemClock


class RequestStats:
    """Counts in one-second buckets, kept for `max_window` seconds (memory: one bucket per
    second per service)."""

    def __init__(self, max_window: float = 300.0, clock: Clock | None = None) -> None:
        self._max_window = max_window
        self._clock: Clock = clock or SystemClock()
        self._buckets: dict[str, collections.deque[list[int]]] = {}
        self._total: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}

    def started(self, service: str) -> None:
        """A request for `service` arrived (and is now in flight)."""
        second = int(self._clock.now())
        buckets = self._buckets.setdefault(service, collections.deque())
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += 1
        else:
            buckets.append([second, 1])
        self._expire(buckets, second)
        self._total[service] = self._total.get(service, 0) + 1
        self._in_flight[service] = self._in_flight.get(service, 0) + 1

    def finished(self, service: str) -> None:
        """A request for `service` is done (answered, failed, or the client went away)."""
        if self._in_flight.get(service, 0) > 0:
            self._in_flight[service] -= 1

    def rps(self, service: str, window: float = 60.0) -> float:
        """Requests per second over the last `window` whole-second buckets (at most
        `max_window`), the current, partial second included; a service seen for less than
        `window` is averaged over the whole window all the same."""
        window = min(window, self._max_window)
        now = self._clock.now()
        since = now - window
        buckets = self._buckets.get(service, ())
        count = sum(n for second, n in buckets if second > since)
        return count / window

    def total(self, service: str) -> int:
        """Requests for `service` since the proxy started."""
        return self._total.get(service, 0)

    def in_flight(self, service: str) -> int:
        """Requests for `service` in flight now, including those waiting for a replica."""
        return self._in_flight.get(service, 0)

    def services(self) -> list[str]:
        return sorted(self._total)

    def _expire(self, buckets: collections.deque[list[int]], second: int) -> None:
        while buckets and buckets[0][0] + self._max_window < second:
            buckets.popleft()
