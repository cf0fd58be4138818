"""What the agents listed, asked once per command: one job listing per machine.

A command (a plan, an apply, both under one lock) asks each machine's agent for its jobs when
it first needs them, and every later question of the same command (the refresh of each run,
the placement of each run, the delete of each run) is answered from that listing instead of
asking again: removing 300 runs from a fleet of 10 hosts used to list every host for every
run (3,000 listings), and applying N runs on the local fleet read its host facts N times.

The listing is kept up to date with what this process does itself: the jobs it submits, stops
and removes (`record`, `forget`). What others do meanwhile it does not see, which is safe
because the agent stays the arbiter: a job placed on GPUs or ports another submission took is
refused (409) and sent back to placement, which asks again (`relist`); a placement that finds
no room asks again before it concludes so (`runs/handler.py`'s `place_now`). A failure to
list is kept too (an unreachable host costs its timeout once per command, not once per run).

Outside `kept()` nothing is kept: every question is asked of the agent, as a long-lived
process (watch, the web UI) needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dstack_plan.agent.api_models import JobInfo

if TYPE_CHECKING:
    from dstack_plan.providers.base import Instance

MachineKey = tuple[str, str]
"""(fleet, machine): the local fleet's one machine has one key whatever name a job records
for it (`localhost`, the hostname)."""


class JobListings:
    """The job listings and implicit machines of one command (see the module doc)."""

    def __init__(self) -> None:
        self._depth = 0
        self._listed: dict[MachineKey, asyncio.Future[_Listing]] = {}
        self._implicit: dict[str, asyncio.Future[list[Instance]]] = {}

    @property
    def active(self) -> bool:
        """Whether a command keeps its listings now (inside `kept()`)."""
        return self._depth > 0

    @contextmanager
    def kept(self) -> Iterator[None]:
        """Keep what the agents list until the outermost `kept()` ends (nested ones share
        it: an apply flow's plan and apply make one command)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self._listed.clear()
                self._implicit.clear()

    async def jobs(
        self,
        key: MachineKey,
        ask: Callable[[], Awaitable[list[JobInfo]]],
        run_name: str | None = None,
    ) -> list[JobInfo]:
        """The jobs on machine `key` (those of `run_name` when given), oldest first: `ask`ed
        of its agent once per command (callers that come while the listing is on its way
        wait for the same one), every time outside one. Its error is raised to every
        caller of the command."""
        if not self.active:
            return _Listing(await ask()).jobs(run_name)
        listed = self._listed.get(key)
        if listed is None:
            listed = self._listed[key] = asyncio.ensure_future(_Listing.of(ask))
        return (await asyncio.shield(listed)).jobs(run_name)

    def start(self, key: MachineKey, ask: Callable[[], Awaitable[list[JobInfo]]]) -> None:
        """Ask machine `key` for its jobs now, without waiting for the answer: a command
        that knows which machines it will ask (a plan, the machines its state's runs are on)
        sends the requests before its other work, and the agents build their answers
        meanwhile. The first `jobs` question of `key` waits for this answer. Nothing outside
        `kept()`."""
        if not self.active or key in self._listed:
            return
        listed = self._listed[key] = asyncio.ensure_future(_Listing.of(ask))
        listed.add_done_callback(_retrieve)  # a failure nobody asks about is not logged

    def record(self, key: MachineKey, infos: Iterable[JobInfo]) -> None:
        """This process submitted (or changed) the jobs `infos` on machine `key`: a kept
        listing shows them as they are now."""
        listing = self._kept(key)
        if listing is not None:
            for info in infos:
                listing.put(info)

    def forget(self, key: MachineKey, ids: Iterable[str]) -> None:
        """This process removed the jobs `ids` from machine `key`."""
        listing = self._kept(key)
        if listing is not None:
            for job_id in ids:
                listing.pop(job_id)

    def relist(self, fleet: str) -> None:
        """What `fleet`'s machines hold is not known any more (an agent refused a job, or a
        change of this process was cut short): the next question asks their agents again."""
        for key in [k for k in self._listed if k[0] == fleet]:
            del self._listed[key]

    async def implicit(
        self, fleet: str, refresh: Callable[[], Awaitable[list[Instance]]]
    ) -> list[Instance]:
        """A fleet of implicit machines (`local`) as its provider `refresh`es it (host facts):
        once per command."""
        if not self.active:
            return await refresh()
        found = self._implicit.get(fleet)
        if found is None or (found.done() and (found.cancelled() or found.exception())):
            # an error is not kept: the next question asks again
            found = self._implicit[fleet] = asyncio.ensure_future(refresh())
        return await asyncio.shield(found)

    def _kept(self, key: MachineKey) -> _Listing | None:
        listed = self._listed.get(key)
        if listed is None or not listed.done() or listed.cancelled() or listed.exception():
            if listed is not None and not listed.done():
                # a change made while the listing is on its way may or may not be in it
                del self._listed[key]
            return None
        return listed.result()


def _retrieve(done: asyncio.Future[_Listing]) -> None:
    if not done.cancelled():
        done.exception()


class _Listing:
    """One machine's jobs by id, in the agent's order, and by run (a delete asks for one
    run's jobs: a scan of every job for each run would make a destroy quadratic)."""

    def __init__(self, infos: Iterable[JobInfo]) -> None:
        self._jobs: dict[str, JobInfo] = {}
        self._runs: dict[str, dict[str, JobInfo]] = {}
        for info in infos:
            self.put(info)

    @classmethod
    async def of(cls, ask: Callable[[], Awaitable[list[JobInfo]]]) -> _Listing:
        return cls(await ask())

    def jobs(self, run_name: str | None) -> list[JobInfo]:
        if run_name is None:
            return list(self._jobs.values())
        return list(self._runs.get(run_name, {}).values())

    def put(self, info: JobInfo) -> None:
        old = self._jobs.get(info.id)
        if old is not None and old.run_name != info.run_name:
            self._runs[old.run_name].pop(info.id, None)
        self._jobs[info.id] = info
        self._runs.setdefault(info.run_name, {})[info.id] = info

    def pop(self, job_id: str) -> None:
        info = self._jobs.pop(job_id, None)
        if info is not None:
            self._runs[info.run_name].pop(job_id, None)
