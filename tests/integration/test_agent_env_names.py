"""Env names that are no shell identifiers (`MY-VAR`), as dstack's `env:` mapping takes them,
reach a job end to end: the config loads, the job spec carries them, and a real agent gives
them to the job's process or container.

The jobs read them from a program started by `entrypoint`: `commands` run under `/bin/sh -c`,
and dash or busybox sh (unlike bash) drop variables whose names are no identifiers before
running anything (docs/configuration.md says so).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dstack_plan.config.loader import load_text
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job
from tests.infra.agent_process import AgentProcess

NET = 60.0
"""Seconds a test waits for a job before concluding it will not end (a safety net)."""
CONTEXT = JobContext("envs", "run-id", 0, "abc123", 1, "127.0.0.1", ("127.0.0.1",))
ENV = "env:\n  MY-VAR: x\n  spring.profiles.active: dev\n"


def run_spec(text: str) -> RunSpec:
    [resource], issues = load_text(text, "envs.dstack.yml")
    assert not issues, [str(i) for i in issues]
    assert isinstance(resource.spec, RunSpec)
    return resource.spec


async def run_to_done(agent: AgentProcess, spec: RunSpec, tmp_path: Path) -> bytes:
    job = build_job(spec, JobSlot(0, 0), CONTEXT, SecretStore(tmp_path, environ={}), environ={})
    client = agent.client()
    await client.submit(job)
    info = await client.wait(job.id, timeout=NET)
    logs = await client.read_all_logs(job.id)
    assert (info.status.value, info.exit_code) == ("done", 0), logs
    return logs


async def test_a_process_job_sees_a_dashed_env_name(agent: AgentProcess, tmp_path: Path) -> None:
    spec = run_spec(
        f"type: task\nname: envs\nentrypoint: {sys.executable}\n"
        "commands:\n  - -c\n"
        "  - import os; print(os.environ['MY-VAR'], os.environ['spring.profiles.active'])\n" + ENV
    )
    assert await run_to_done(agent, spec, tmp_path) == b"x dev\n"


@pytest.mark.docker
async def test_a_container_job_sees_a_dashed_env_name(
    agent: AgentProcess, busybox_image: str, tmp_path: Path
) -> None:
    image = f"image: {busybox_image}\n"
    spec = run_spec("type: task\nname: envs\n" + image + "entrypoint: /bin/env\n" + ENV)
    lines = (await run_to_done(agent, spec, tmp_path)).decode().splitlines()
    assert "MY-VAR=x" in lines and "spring.profiles.active=dev" in lines
