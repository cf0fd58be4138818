"""Getting a run's code archive onto a host: once per content, whatever the number of jobs."""

from __future__ import annotations

import logging

from dstack_plan.agent.client import AgentClient
from dstack_plan.apply.code_archive import CodeArchive

log = logging.getLogger(__name__)


async def ensure_code(agent: AgentClient, archive: CodeArchive) -> None:
    """Upload `archive` to `agent` unless it holds a blob of that sha256 already.

    Raises AgentError (naming the host) when the agent cannot be reached or refuses it.
    """
    if await agent.has_blob(archive.sha256):
        log.debug("%s has code %s already", agent.host, archive.sha256[:12])
        return
    log.info(
        "uploading code %s (%d files, %d bytes) to %s",
        archive.sha256[:12],
        archive.file_count,
        len(archive.data),
        agent.host,
    )
    await agent.put_blob(archive.sha256, archive.data)
