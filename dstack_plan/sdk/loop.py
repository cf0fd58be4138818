"""Running the SDK's coroutines from plain code, also where an event loop already runs
(Jupyter, IPython): there `asyncio.run` would refuse, so the coroutine runs on a fresh loop
in a worker thread while the caller's loop waits."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """`coroutine`'s result, run to completion here (on a thread of its own when this thread
    already runs an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
