"""Snapshots of the reads that ask every agent: the first read waits and is shared, later
ones are served at once from memory, a fresh value is fetched in the background once the
last is older than max_age, and a failed fetch keeps the last value."""

from __future__ import annotations

import asyncio

import pytest

from dstack_plan.web.snapshots import Snapshot


def test_served_from_memory_and_refreshed_in_the_background() -> None:
    async def scenario() -> None:
        now = [0.0]
        calls: list[int] = []
        release = asyncio.Event()

        async def fetch() -> int:
            calls.append(len(calls))
            if len(calls) == 3:
                raise RuntimeError("agent gone")
            if len(calls) == 2:
                await release.wait()
            return len(calls)

        snapshot = Snapshot(fetch, max_age=2.0, clock=lambda: now[0])
        first = await asyncio.gather(snapshot.get(), snapshot.get())
        assert first == [1, 1] and len(calls) == 1  # one fetch for both readers
        now[0] = 1.0
        assert await snapshot.get() == 1 and len(calls) == 1  # fresh enough
        now[0] = 3.0
        assert await snapshot.get() == 1  # stale: served at once, a fetch started
        await asyncio.sleep(0)
        assert await snapshot.get() == 1 and len(calls) == 2  # only one fetch in flight
        await asyncio.sleep(0)
        assert len(calls) == 2
        release.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert await snapshot.get() == 2
        now[0] = 10.0
        assert await snapshot.get() == 2  # starts the fetch that fails
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert await snapshot.get() == 2  # the last value stays
        await snapshot.close()

    asyncio.run(scenario())


def test_the_first_read_gets_the_error() -> None:
    async def fetch() -> int:
        raise RuntimeError("no agent")

    with pytest.raises(RuntimeError, match="no agent"):
        asyncio.run(Snapshot(fetch).get())
