"""A job's `last_activity_at` on a real agent: set when it starts, moved by
`POST /jobs/{id}/activity` (`AgentClient.touch`), kept in the job record on disk."""

from __future__ import annotations

import asyncio
import json

import pytest

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.errors import AgentError
from tests.infra.agent_helpers import wait_for_status
from tests.infra.agent_process import AgentProcess


async def test_touch_moves_last_activity_and_it_is_kept_on_disk(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(JobSpec(id="dev", run_name="dev", commands=["exec sleep 60"]))
    running = await wait_for_status(client, "dev", ("running",))
    assert running.started_at is not None
    assert running.last_activity_at == running.started_at  # the start counts as activity

    await asyncio.sleep(0.05)
    touched = await client.touch("dev")
    assert touched.last_activity_at is not None
    assert touched.last_activity_at > running.started_at
    assert (await client.get_job("dev")).last_activity_at == touched.last_activity_at
    record = json.loads((agent.data_dir / "jobs" / "dev" / "job.json").read_text())
    assert record["last_activity_at"] == touched.last_activity_at

    agent.restart()  # a process job ends with its agent; the record keeps the activity
    after = await agent.client().get_job("dev")
    assert after.finished
    assert after.last_activity_at == touched.last_activity_at
    again = await agent.client().touch("dev")  # a finished job is left as it is
    assert again.last_activity_at == touched.last_activity_at


async def test_touching_an_unknown_job_is_a_404(agent: AgentProcess) -> None:
    with pytest.raises(AgentError) as raised:
        await agent.client().touch("nope")
    assert raised.value.status == 404
