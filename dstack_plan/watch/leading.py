"""Serving only while this watch leads: a standby watch binds no port until it takes the
leader lease, and lets go of its server when another watch takes it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dstack_plan.errors import DstackPlanError
from dstack_plan.watch.actors import default_actors

if TYPE_CHECKING:
    from dstack_plan.watch.loop import Watcher
    from dstack_plan.watch.serving import Serving

log = logging.getLogger(__name__)


class ServeWhileLeading:
    """Serves while the watch `watcher` leads (`Watcher.on_lead`): `start` binds when it
    takes the lease, and the server is let go when another watch takes it. A failure to
    bind is a warning, once, never an exit: the watch goes on reconciling."""

    def __init__(self, watcher: Watcher, start: Callable[[], Awaitable[Serving]]) -> None:
        self._watcher = watcher
        self._start = start
        self.serving: Serving | None = None
        self._failed = False

    async def __call__(self, leader: bool) -> None:
        if leader and self.serving is None and not self._failed:
            try:
                self.serving = await self._start()
            except DstackPlanError as e:
                self._failed = True
                log.warning("not serving the services: %s", e)
                return
            self._watcher.actors = default_actors(self.serving)
        elif not leader and self.serving is not None:
            await self.close()
            self._failed = False

    async def close(self) -> None:
        """Stop serving (when this watch stops or another leads)."""
        if self.serving is not None:
            serving, self.serving = self.serving, None
            self._watcher.actors = default_actors(None)
            await serving.close()
