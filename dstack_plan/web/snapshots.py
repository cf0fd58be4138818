"""Reads that ask every agent (the runs, the hosts) kept as snapshots, so that pages and API
answers render from memory: the last value is served at once while a newer one is fetched
in the background once it is older than `max_age` (stale while revalidating). An answer is
so at most `max_age` plus one fetch old, which the UI's 2-second polling shows a moment
later; only the first read of each waits for its fetch. A failed background fetch keeps the
last value (and is logged); with no value yet, the error is the reader's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

MAX_AGE = 2.0
"""Seconds a snapshot is served before a fresh one is fetched (the UI polls every 2 s)."""


class Snapshot(Generic[T]):
    """The last value of `fetch` (see the module doc)."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[T]],
        *,
        max_age: float = MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._max_age = max_age
        self._clock = clock
        self._value: tuple[float, T] | None = None
        self._fetching: asyncio.Task[T] | None = None

    async def get(self) -> T:
        if self._value is None:
            return await self._refresh()  # shared by the readers that arrive meanwhile
        fetched_at, value = self._value
        if self._clock() - fetched_at > self._max_age and self._fetching is None:
            self._start()
        return value

    async def close(self) -> None:
        """Cancel a fetch in flight."""
        if self._fetching is not None:
            self._fetching.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._fetching

    def _start(self) -> asyncio.Task[T]:
        async def fetch() -> T:
            try:
                value = await self._fetch()
                self._value = (self._clock(), value)
                return value
            finally:
                self._fetching = None

        task = asyncio.get_running_loop().create_task(fetch())
        task.add_done_callback(_log_failure)
        self._fetching = task
        return task

    async def _refresh(self) -> T:
        task = self._fetching or self._start()
        return await asyncio.shield(task)


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("refreshing a snapshot failed: %s", task.exception())
