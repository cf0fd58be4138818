"""A service's new replicas (a scale-up's, a rolling update's) race other projects'
submissions as a new run's jobs do: when the agent refuses one because another job took its
GPUs or host ports at that moment (409), the replica is withdrawn, placed again from a fresh
listing and submitted again (`RunHandler.admit_jobs`, `runs/admission.py`), instead of
failing. A fake agent on a fake local machine; no processes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo, JobSpec, JobStatus
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.clock import FakeClock
from dstack_plan.config.runs import ServiceSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.base import Instance, MachineResources
from dstack_plan.providers.local import LOCAL_FLEET, LocalProvider
from dstack_plan.runs.admission import CONFLICT, MAX_ATTEMPTS
from dstack_plan.runs.handler import RunHandler
from dstack_plan.runs.queueing import NoCapacity
from dstack_plan.runs.rollout_jobs import start_replica
from dstack_plan.state import ResourceState

DEPLOYMENT = "abc123"
SERVICE = {"type": "service", "name": "web", "port": 8000, "commands": ["serve"]}
FIRST_JOB = "web-0-0-100-abc123"


class RacingAgent:
    """Holds jobs like the agent; refuses the next `refusals` submits with `code` (409), as
    when another project's job took the room between this command's listing and its submit."""

    def __init__(self, refusals: int, code: str = "ports_unavailable") -> None:
        self.refusals = refusals
        self.code = code
        self.jobs = {FIRST_JOB: _info(FIRST_JOB)}
        self.submits = 0
        self.listings = 0

    async def list_jobs(self, status: Any = None, run_name: Any = None) -> list[JobInfo]:
        self.listings += 1
        return [j for j in self.jobs.values() if run_name in (None, j.run_name)]

    async def submit(self, spec: JobSpec) -> JobInfo:
        self.submits += 1
        if self.refusals:
            self.refusals -= 1
            raise AgentError("localhost", "ports: host ports in use: 8000", 409, self.code)
        self.jobs[spec.id] = _info(spec.id)
        return self.jobs[spec.id]

    async def get_job(self, job_id: str) -> JobInfo:
        if job_id not in self.jobs:
            raise AgentError("localhost", f"no job with id {job_id!r}", 404, "not_found")
        return self.jobs[job_id]

    async def delete(self, job_id: str, force: bool = False) -> None:
        if job_id not in self.jobs:
            raise AgentError("localhost", f"no job with id {job_id!r}", 404, "not_found")
        del self.jobs[job_id]


class FakeMachine(LocalProvider):
    """This machine, with fixed resources and `agent` as its agent."""

    def __init__(self, agent: RacingAgent) -> None:
        super().__init__()
        self._agent = agent

    async def agent(self, instance: Instance) -> Any:
        return self._agent

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        resources = MachineResources(cpus=16, memory_gb=64, disk_gb=500)
        return [i.model_copy(update={"resources": resources}) for i in instances]


def _info(job_id: str) -> JobInfo:
    return JobInfo(
        id=job_id,
        run_name="web",
        runtime="process",
        status=JobStatus.RUNNING,
        submitted_at=1.0,
        spec={"labels": {"deployment": DEPLOYMENT}},
    )


def _no_ssh(*args: Any) -> Any:
    raise AssertionError("no SSH fleet here")


def service() -> ResourceState:
    """Service `web` with one replica running."""
    return ResourceState.create(
        "service.web",
        provider="local",
        spec=SERVICE,
        status="running",
        now=datetime(2026, 1, 1, tzinfo=timezone.utc),
        attributes={
            "fleet": LOCAL_FLEET,
            "generation": 100,
            "deployment": DEPLOYMENT,
            "jobs": [{"id": FIRST_JOB, "replica": 0, "node": 0, "status": "running"}],
        },
    )


def add_replica(agent: RacingAgent, how: str) -> tuple[list[str], list[str]]:
    """Give `web` a second job: by scaling it to two replicas (`scale`), or as a rolling
    update's new replica beside the old one (`rollout`); (its jobs' ids, what it said)."""
    entry = service()
    handler = RunHandler(FleetMachines(FakeMachine(agent), _no_ssh), SecretStore("."), DEPLOYMENT)
    said: list[str] = []

    async def add() -> list[str]:
        ctx = ApplyContext(
            clock=FakeClock(5.0), progress=lambda address, message: said.append(message)
        )
        with handler.machines.listings.kept():  # as within a command
            if how == "scale":
                outcome = await handler.scale(entry, 2, ctx)
                return [job["id"] for job in outcome.attributes["jobs"]]
            spec = spec_from_normalized("service", SERVICE)
            assert isinstance(spec, ServiceSpec)
            new = await start_replica(handler, entry, spec, 0, 200, ctx)
            return [FIRST_JOB, new.id]

    return asyncio.run(add()), said


@pytest.mark.parametrize("how", ["scale", "rollout"])
@pytest.mark.parametrize("code", ["ports_unavailable", "gpus_unavailable"])
def test_a_replica_that_loses_the_race_is_placed_and_submitted_again(code: str, how: str) -> None:
    agent = RacingAgent(refusals=1, code=code)
    jobs, said = add_replica(agent, how)
    assert len(jobs) == 2 and jobs[0] == FIRST_JOB and jobs[1] != FIRST_JOB
    assert set(agent.jobs) == set(jobs)  # the new replica runs; nothing else was left
    assert agent.submits == 2
    assert any(CONFLICT in message for message in said)


@pytest.mark.parametrize("how", ["scale", "rollout"])
def test_a_replica_that_loses_every_race_is_no_capacity_naming_the_conflict(how: str) -> None:
    agent = RacingAgent(refusals=MAX_ATTEMPTS)
    with pytest.raises(NoCapacity, match=CONFLICT):
        add_replica(agent, how)
    assert agent.submits == MAX_ATTEMPTS
    assert set(agent.jobs) == {FIRST_JOB}  # the running replica is left alone
