"""One thread that calls functions at wall-clock deadlines (max_duration, kill-after-timeout)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timers:
    """`call_at(when, fn)` runs `fn` in the timer thread at `when` (a time.time() value)."""

    def __init__(self, now: Callable[[], float] = time.time):
        self._now = now
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set = set()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="agent-timers", daemon=True)
        self._thread.start()

    def call_at(self, when: float, fn: Callable[[], None]) -> int:
        """Schedule `fn`; returns a handle for `cancel`."""
        handle = next(self._ids)
        with self._cond:
            heapq.heappush(self._heap, (when, handle, fn))
            self._cond.notify()
        return handle

    def cancel(self, handle: int) -> None:
        """Make sure a scheduled call does not run (no-op if it already ran)."""
        with self._cond:
            self._cancelled.add(handle)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > self._now():
                    timeout = self._heap[0][0] - self._now() if self._heap else None
                    self._cond.wait(timeout)
                _, handle, fn = heapq.heappop(self._heap)
                if handle in self._cancelled:
                    self._cancelled.discard(handle)
                    continue
            try:
                fn()
            except Exception:
                log.exception("timer callback failed")
