"""Ctrl-C on `dstack attach`: a log stream cancelled just as data arrives must still end.

Before Python 3.12, `asyncio.wait_for` swallows a cancellation that comes in the same loop
turn as its awaitable's result; the agent client's reads then went on waiting for more log
output, and the CLI hung after Ctrl-C.
"""

from __future__ import annotations

import asyncio

from dstack_plan.agent.http import _Exchange


def test_a_read_cancelled_as_its_data_arrives_is_cancelled() -> None:
    async def main() -> bool:
        data: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        more: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def follow() -> None:
            await _Exchange._guard(data, 30, "waiting for data")
            await _Exchange._guard(more, 30, "waiting for data")  # no more output comes

        task = asyncio.create_task(follow())
        await asyncio.sleep(0)  # the first read waits
        data.set_result(b"a log line\n")
        task.cancel()  # Ctrl-C, in the same turn
        await asyncio.wait({task}, timeout=5)
        return task.cancelled()

    assert asyncio.run(main())


def test_a_read_still_times_out_and_returns_its_data() -> None:
    from dstack_plan.agent.http import TransportError

    async def main() -> tuple[bytes, str]:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[bytes] = loop.create_future()
        loop.call_soon(ready.set_result, b"data")
        got = await _Exchange._guard(ready, 5, "waiting for data")
        try:
            await _Exchange._guard(loop.create_future(), 0.05, "waiting for data")
        except TransportError as e:
            return got, str(e)
        return got, "no timeout"

    assert asyncio.run(main()) == (b"data", "timed out after 0.05s waiting for data")
