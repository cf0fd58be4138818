"""The agent dates job output: `GET /jobs/{id}/logs` answers with `times` and starts at
`since=`, for polling and following alike, and old callers get what they always got."""

from __future__ import annotations

import time

import httpx

from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.client import AgentClient
from tests.infra.agent_process import AgentProcess

COMMANDS = ["echo early", "sleep 2", "echo late"]


async def test_logs_carry_times_and_start_at_since(agent: AgentProcess) -> None:
    client: AgentClient = agent.client()
    before = time.time()
    job = await client.submit(JobSpec(run_name="timed", commands=COMMANDS))
    await client.wait(job.id, timeout=30)
    after = time.time()

    everything = await client.logs(job.id)
    assert everything.data == b"early\nlate\n"
    (o1, t1), (o2, t2) = everything.times
    assert (o1, o2) == (0, len(b"early\n"))
    assert before - 1 <= t1 < t2 - 1.5 and t2 <= after + 1

    late = await client.logs(job.id, since=t2 - 0.5)
    assert (late.offset, late.data, late.times) == (o2, b"late\n", [(o2, t2)])
    assert (await client.logs(job.id, since=t1)).data == b"early\nlate\n"
    assert (await client.logs(job.id, since=after + 5)).data == b""
    followed = b"".join([c.data async for c in client.follow_logs(job.id, since=t2 - 0.5)])
    assert followed == b"late\n"

    async with httpx.AsyncClient(
        base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, trust_env=False
    ) as http:
        old_caller = (await http.get(f"/jobs/{job.id}/logs", params={"offset": 0})).json()
        assert old_caller["offset"] == 0 and old_caller["next_offset"] == len(b"early\nlate\n")
        bad = await http.get(f"/jobs/{job.id}/logs", params={"since": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "since"
    await client.aclose()
