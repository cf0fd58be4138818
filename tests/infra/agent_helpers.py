"""Polling helpers for tests and benchmarks that drive a real agent through its client."""

from __future__ import annotations

import asyncio
import time

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.client import AgentClient


async def wait_for_status(
    client: AgentClient, job_id: str, statuses: tuple[str, ...], timeout: float = 10.0
) -> JobInfo:
    """Poll until the job is in one of `statuses`; fail with its last state otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        info = await client.get_job(job_id)
        if info.status.value in statuses:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {info.status.value}, wanted {statuses}: {info}")
        await asyncio.sleep(0.02)


async def wait_for_log(
    client: AgentClient, job_id: str, needle: bytes, timeout: float = 10.0
) -> bytes:
    """Poll the log until it contains `needle`; returns the log read so far."""
    deadline = time.monotonic() + timeout
    while True:
        data = await client.read_all_logs(job_id)
        if needle in data:
            return data
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{needle!r} not in the log of {job_id} after {timeout}s: {data!r}"
            )
        await asyncio.sleep(0.02)
