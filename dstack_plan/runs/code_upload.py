"""Getting a run's code archive onto a host: once per content, whatever the number of jobs.

The agent removes a blob with the last job that names it (`agent/blobs.py`), so a blob found
(or uploaded) by `ensure_code` may be gone by the time a job is submitted (another run with
the same content was deleted meanwhile): `submit_with_code` then uploads it again.
"""

from __future__ import annotations

import logging

from dstack_plan.agent.api_models import JobInfo, JobSpec
from dstack_plan.agent.client import AgentClient
from dstack_plan.errors import AgentError
from dstack_plan.runs.code_archive import CodeArchive

log = logging.getLogger(__name__)

MISSING_CODE = "missing_code"
"""The agent's error code for a submitted job whose code archive it does not hold."""


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


async def submit_with_code(
    agent: AgentClient, spec: JobSpec, archive: CodeArchive | None
) -> JobInfo:
    """Submit `spec` (whose code is `archive`, uploaded by `ensure_code`); when the agent
    answers that it no longer holds the archive, upload it again and submit once more."""
    try:
        return await agent.submit(spec)
    except AgentError as e:
        if archive is None or e.code != MISSING_CODE:
            raise
    log.info("%s removed code %s meanwhile: uploading it again", agent.host, archive.sha256[:12])
    await agent.put_blob(archive.sha256, archive.data)
    return await agent.submit(spec)
