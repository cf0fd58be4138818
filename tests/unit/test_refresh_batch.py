"""Refresh in batches: one job listing per agent for all runs, the same answers as one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.plan.model import DEPOSED_KEY, ResourceChange
from dstack_plan.project import Project
from dstack_plan.providers.local import LocalProvider
from dstack_plan.runs.handler import RunHandler
from dstack_plan.state import LocalBackend, ResourceState, State

NOW = datetime(2025, 1, 2, 12, 0, tzinfo=timezone.utc)


class FakeAgent:
    """Knows some jobs; counts how it was asked."""

    def __init__(self, statuses: dict[str, str]):
        self.jobs = {
            job_id: JobInfo(
                id=job_id, run_name="x", runtime="process", status=status, submitted_at=1.0
            )
            for job_id, status in statuses.items()
        }
        self.list_calls = 0
        self.get_calls = 0

    async def list_jobs(self, status: Any = None, run_name: Any = None) -> list[JobInfo]:
        assert status is None and run_name is None
        self.list_calls += 1
        return list(self.jobs.values())

    async def get_job(self, job_id: str) -> JobInfo:
        from dstack_plan.errors import AgentError

        self.get_calls += 1
        if job_id not in self.jobs:
            raise AgentError("localhost", f"no job {job_id}", 404)
        return self.jobs[job_id]


class FakeLocal(LocalProvider):
    """This machine's provider, with a fake agent."""

    def __init__(self, agent: FakeAgent):
        super().__init__()
        self._agent = agent
        self.asked = 0

    async def agent(self, instance: Any) -> Any:
        self.asked += 1
        return self._agent


def run_entry(
    address: str, status: str, jobs: Sequence[tuple[str, str]], fleet: str = "local", **extra: Any
) -> ResourceState:
    return ResourceState.create(
        address,
        provider="local",
        spec={"name": address.split(".", 1)[1]},
        status=status,
        now=NOW,
        attributes={
            "fleet": fleet,
            "jobs": [
                {"id": job_id, "replica": i, "node": 0, "status": job_status}
                for i, (job_id, job_status) in enumerate(jobs)
            ],
            **extra,
        },
    )


RUNS = [
    run_entry("task.live", "submitted", [("live-0", "submitted"), ("live-1", "submitted")]),
    run_entry("task.finished", "running", [("fin-0", "running")]),
    run_entry("task.old", "done", [("gone-0", "done")]),  # unknown to the agent, finished
    run_entry("service.lost", "running", [("gone-1", "running")]),  # unknown, was active
    run_entry("dev-environment.idle", "terminated", []),  # no jobs recorded
    run_entry("task.mixed", "running", [("gone-2", "running"), ("mix-1", "failed")]),
]
AGENT_JOBS = {"live-0": "running", "live-1": "pulling", "fin-0": "done", "mix-1": "failed"}


def handler(agent: FakeAgent) -> tuple[RunHandler, FakeLocal]:
    local = FakeLocal(agent)
    return RunHandler(FleetMachines(local, _no_ssh), SecretStore(Path(".")), "abc123"), local


def _no_ssh(*args: Any) -> Any:
    raise AssertionError("no SSH fleet here")


def test_refresh_many_answers_as_refresh_does_with_one_listing() -> None:
    one_by_one, _ = handler(FakeAgent(AGENT_JOBS))
    expected = {r.address: asyncio.run(one_by_one.refresh(r, ApplyContext())) for r in RUNS}
    agent = FakeAgent(AGENT_JOBS)
    batch, local = handler(agent)
    found = asyncio.run(batch.refresh_many(RUNS, ApplyContext()))
    assert found == expected
    assert list(found) == [r.address for r in RUNS]
    assert (agent.list_calls, agent.get_calls, local.asked) == (1, 0, 1)
    assert found["task.live"].status == "running"
    assert found["task.finished"].status == "done"
    assert found["task.old"] == Refreshed("done", dict(RUNS[2].attributes))
    assert found["service.lost"].gone == "jobs are gone from the agent"
    assert found["task.mixed"].status == "failed"
    assert [j["status"] for j in found["task.mixed"].attributes["jobs"]] == ["running", "failed"]


def test_refresh_many_without_jobs_asks_no_agent() -> None:
    agent = FakeAgent({})
    batch, local = handler(agent)
    found = asyncio.run(batch.refresh_many([RUNS[4]], ApplyContext()))
    assert found == {"dev-environment.idle": Refreshed("terminated", dict(RUNS[4].attributes))}
    assert (agent.list_calls, local.asked) == (0, 0)


def test_refresh_many_on_a_fleet_missing_from_state_fails_like_refresh() -> None:
    pooled = run_entry("task.pooled", "running", [("p-0", "running")], fleet="pool")
    batch, _ = handler(FakeAgent({}))
    with pytest.raises(ProviderError, match="fleet 'pool' is not in state"):
        asyncio.run(batch.refresh(pooled, ApplyContext()))
    with pytest.raises(ProviderError, match="fleet 'pool' is not in state"):
        asyncio.run(batch.refresh_many([RUNS[0], pooled], ApplyContext()))


class Recording(ResourceHandler):
    """A handler with only the default batch hook: it calls `refresh` once per entry."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        raise NotImplementedError

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        raise NotImplementedError

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        raise NotImplementedError

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        self.seen.append(current.address)
        assert DEPOSED_KEY not in current.attributes  # handlers never see deposed records
        if current.address == "fleet.gone":
            return Refreshed("active", dict(current.attributes), gone="instances terminated")
        if current.address == "volume.grown":
            return Refreshed("available", {**current.attributes, "size": 2})
        return Refreshed(current.status, dict(current.attributes))


def test_project_refresh_batches_per_handler_and_keeps_unchanged_entries(
    tmp_path: Path,
) -> None:
    deposed = ResourceState.create(
        "volume.grown", provider="aws", spec={"name": "grown"}, status="old", now=NOW
    ).model_dump(mode="json")
    entries = [
        *RUNS,
        ResourceState.create(
            "fleet.gone", provider="aws", spec={"name": "gone"}, status="active", now=NOW
        ),
        ResourceState.create(
            "volume.grown",
            provider="aws",
            spec={"name": "grown"},
            status="available",
            now=NOW,
            attributes={"size": 1, DEPOSED_KEY: [deposed]},
        ),
        ResourceState.create(
            "gateway.same", provider="aws", spec={"name": "same"}, status="up", now=NOW
        ),
        ResourceState.create(
            "gateway.broken",
            provider="aws",
            spec={"name": "broken"},
            status="creating",
            now=NOW,
            tainted=True,
        ),
    ]
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    state = State.empty()
    for resource in entries:
        state = state.with_resource(resource)
    backend.write(state, backend.read().version)

    agent = FakeAgent(AGENT_JOBS)
    runs, _ = handler(agent)
    others = Recording()
    project = Project(tmp_path, state_path=path, agent_dir=tmp_path / "agent")
    kinds = ("task", "service", "dev-environment")
    project.handlers = lambda: {  # type: ignore[method-assign]
        **{k: runs for k in kinds},
        **{k: others for k in ("fleet", "volume", "gateway")},
    }
    refresh = asyncio.run(project.refresh())

    assert agent.list_calls == 1 and agent.get_calls == 0
    assert others.seen == ["fleet.gone", "gateway.same", "volume.grown"]  # not the tainted one
    assert refresh.drift == {
        "service.lost": "jobs are gone from the agent",
        "fleet.gone": "instances terminated",
    }
    before, after = refresh.snapshot.state.resources, refresh.state.resources
    assert list(after) == list(before)
    for address in ("task.old", "dev-environment.idle", "gateway.same", "gateway.broken"):
        assert after[address] is before[address]
    assert after["task.live"].status == "running"
    assert after["task.live"].updated_at == before["task.live"].updated_at
    grown = after["volume.grown"]
    assert grown.attributes["size"] == 2 and grown.attributes[DEPOSED_KEY] == [deposed]
    assert refresh.state.serial == refresh.snapshot.state.serial


def test_project_refresh_of_an_unchanged_state_is_the_state_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    backend.write(State.empty().with_resource(RUNS[2]), "absent")
    agent = FakeAgent({})
    runs, _ = handler(agent)
    project = Project(tmp_path, state_path=path, agent_dir=tmp_path / "agent")
    project.handlers = lambda: {"task": runs}  # type: ignore[method-assign]
    refresh = asyncio.run(project.refresh())
    assert refresh.state is refresh.snapshot.state
    assert refresh.drift == {}
