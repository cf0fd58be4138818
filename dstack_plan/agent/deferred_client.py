"""An agent client that reaches its agent only when a request needs it.

Providers hand out agent clients before the agent may be reachable (not started yet, or
behind an SSH connection not opened yet). Subclasses say how to reach it (`_open`); every
request then goes to the client `_open` returned.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dstack_plan.agent.api_models import LogChunk
from dstack_plan.agent.client import FOLLOW_IDLE_TIMEOUT, AgentClient
from dstack_plan.agent.http import Response


class DeferredAgentClient(AgentClient):
    """An `AgentClient` whose connection is made by the first request (see module doc)."""

    def __init__(self, host: str):
        # The base client is never used to connect: requests go to `_agent` (see `_request`).
        super().__init__("http://127.0.0.1:1", "", host=host)
        self._agent: AgentClient | None = None
        self._lock = asyncio.Lock()

    async def _open(self) -> AgentClient:
        """A client of the reachable agent (starting or connecting to it as needed)."""
        raise NotImplementedError

    async def _connected(self) -> AgentClient:
        async with self._lock:
            if self._agent is None:
                self._agent = await self._open()
            return self._agent

    async def _request(self, method: str, path: str, **kwargs: Any) -> Response:
        agent = await self._connected()
        return await agent._request(method, path, **kwargs)

    async def follow_logs(
        self,
        job_id: str,
        offset: int = 0,
        idle_timeout: int = FOLLOW_IDLE_TIMEOUT,
        since: float | None = None,
    ) -> AsyncIterator[LogChunk]:
        agent = await self._connected()
        async for chunk in agent.follow_logs(job_id, offset, idle_timeout, since=since):
            yield chunk
