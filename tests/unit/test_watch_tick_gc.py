"""A watch tick runs without the cyclic GC (as a plan does), and gives it back afterwards: a
full collection over a large state most ticks was a third of a tick's CPU at 10,000 jobs."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from dstack_plan.project import Project
from dstack_plan.watch.loop import Watcher
from dstack_plan.watch.tick import Acted, Tick


class _SeesTheCollector:
    name = "sees-gc"

    def __init__(self) -> None:
        self.seen: list[bool] = []

    async def act(self, tick: Tick) -> Acted:
        self.seen.append(gc.isenabled())
        return Acted()


def test_a_tick_pauses_the_collector_and_gives_it_back(tmp_path: Path) -> None:
    spy = _SeesTheCollector()

    async def ticks() -> None:
        project = Project(tmp_path)
        watcher = Watcher(project, actors=[spy])
        try:
            await watcher.tick()
            assert gc.isenabled()
            gc.disable()  # a collector someone else turned off stays off
            try:
                await watcher.tick()
                assert not gc.isenabled()
            finally:
                gc.enable()
        finally:
            await project.close()

    assert gc.isenabled()
    asyncio.run(ticks())
    assert spy.seen == [False, False]
