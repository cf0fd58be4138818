"""A run's earlier attempts (`runs/attempts.py`): how an ended attempt is recorded and bounded,
which attempt `--attempt N` reads, and which jobs deleting the run removes or, for a retry,
keeps on the agent."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo, JobStatus
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.clock import FakeClock
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError, DstackPlanError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.providers.local import LocalProvider
from dstack_plan.runs.attempts import (
    MAX_ATTEMPTS_KEPT,
    Attempt,
    attempt_jobs,
    attempts_of,
    current_attempt,
    kept_job_ids,
    spans,
    with_ended,
)
from dstack_plan.runs.handler import RunHandler, _unused_generation
from dstack_plan.runs.jobs import JobSlot
from dstack_plan.runs.ownership import jobs_to_remove
from dstack_plan.runs.records import JobRecord
from dstack_plan.state import ResourceState

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
DEPLOYMENT = "abc123"
SPEC = {"type": "task", "name": "flaky", "commands": ["true"]}


def record(job_id: str, status: str = "failed", **fields: Any) -> JobRecord:
    return JobRecord(id=job_id, status=status, **fields)


def entry(
    jobs: list[str], attempts: tuple[Attempt, ...] = (), generation: int = 200
) -> ResourceState:
    return ResourceState.create(
        "task.flaky",
        provider="local",
        spec=SPEC,
        status="done",
        now=NOW,
        attributes={
            "generation": generation,
            "deployment": DEPLOYMENT,
            "jobs": [{"id": j, "status": "done"} for j in jobs],
            "attempts": [a.to_json() for a in attempts],
        },
    )


FIRST = Attempt.ended(
    1,
    [record("flaky-0-0-100-abc123", reason="container_exited_with_error: exited with code 3")],
    now=50.0,
)


def test_an_ended_attempt_says_the_worst_status_of_its_jobs_and_why() -> None:
    jobs = [
        record("a", "terminated", reason="terminated_by_server", finished_at=12.0),
        record("b", "failed", reason="container_exited_with_error: exited with code 3"),
        record("c", "done", finished_at=10.0),
    ]
    attempt = Attempt.ended(4, jobs, now=99.0)
    assert (attempt.attempt, attempt.status) == (4, "failed")
    assert attempt.reason == "container_exited_with_error: exited with code 3"
    assert attempt.ended_at == 12.0  # its last job's end, not when watch saw it
    assert Attempt.ended(1, [record("x", "done")], now=99.0).ended_at == 99.0
    assert Attempt.from_json(attempt.to_json()) == attempt


def test_attempts_are_numbered_on_and_only_the_last_ten_are_kept() -> None:
    attributes: dict[str, Any] = {}
    assert current_attempt(attributes) == 1
    dropped_all: list[Attempt] = []
    for n in range(1, MAX_ATTEMPTS_KEPT + 3):
        attributes, dropped = with_ended(attributes, [record(f"job-{n}")], now=float(n))
        dropped_all += dropped
    kept = attempts_of(attributes)
    assert [a.attempt for a in kept] == list(range(3, MAX_ATTEMPTS_KEPT + 3))
    assert [a.attempt for a in dropped_all] == [1, 2]
    assert current_attempt(attributes) == MAX_ATTEMPTS_KEPT + 3
    assert "job-1" not in kept_job_ids(attributes) and "job-3" in kept_job_ids(attributes)


def test_a_hand_edited_record_reads_as_far_as_it_can() -> None:
    attributes = {"attempts": [FIRST.to_json(), {"attempt": "two"}, "junk", {"attempt": 0}]}
    assert attempts_of(attributes) == (FIRST,)
    assert attempts_of({"attempts": {"not": "a list"}}) == ()


def test_which_jobs_an_attempt_number_reads() -> None:
    run = entry(["flaky-0-0-200-abc123"], (FIRST,))
    assert [j.id for j in attempt_jobs(run, None)] == ["flaky-0-0-200-abc123"]
    assert [j.id for j in attempt_jobs(run, 2)] == ["flaky-0-0-200-abc123"]
    assert [j.id for j in attempt_jobs(run, 1)] == ["flaky-0-0-100-abc123"]
    with pytest.raises(DstackPlanError, match=r"has no attempt 3 \(its attempts: 1-2\)"):
        attempt_jobs(run, 3)
    with pytest.raises(DstackPlanError, match=r"its attempts: 1\)"):
        attempt_jobs(entry(["x"]), 2)
    assert spans([7, 1, 2, 3, 9, 10]) == "1-3, 7, 9-10"


def test_deleting_the_run_removes_every_attempts_jobs_and_spares_a_replacements() -> None:
    run = entry(["flaky-0-0-200-abc123"], (FIRST,))
    listed = [info("flaky-0-0-100-abc123", 100), info("flaky-0-0-200-abc123", 200)]
    assert jobs_to_remove(run, listed, DEPLOYMENT, None) == {
        "flaky-0-0-100-abc123",
        "flaky-0-0-200-abc123",
    }
    assert jobs_to_remove(run, listed, DEPLOYMENT, run) == set()


def info(job_id: str, generation: int, status: str = "failed") -> JobInfo:
    labels = {"deployment": DEPLOYMENT, "generation": str(generation)}
    return JobInfo(
        id=job_id,
        run_name="flaky",
        runtime="process",
        status=status,
        submitted_at=1.0,
        spec={"labels": labels},
    )


class FakeAgent:
    """Lists, stops and removes jobs; remembers what it was told."""

    def __init__(self, jobs: list[JobInfo]) -> None:
        self.jobs = {j.id: j for j in jobs}
        self.stopped: list[str] = []
        self.removed: list[str] = []

    async def list_jobs(self, status: Any = None, run_name: Any = None) -> list[JobInfo]:
        return [j for j in self.jobs.values() if run_name in (None, j.run_name)]

    async def get_job(self, job_id: str) -> JobInfo:
        if job_id not in self.jobs:
            raise AgentError("localhost", f"no job {job_id}", 404)
        return self.jobs[job_id]

    async def stop(self, job_id: str, **kwargs: Any) -> JobInfo:
        job = await self.get_job(job_id)
        if job.finished:  # as the agent does: an ended job stays as it ended
            return job
        self.stopped.append(job_id)
        self.jobs[job_id] = self.jobs[job_id].model_copy(update={"status": JobStatus.TERMINATED})
        return self.jobs[job_id]

    async def stop_and_remove(self, job_id: str, *args: Any) -> tuple[JobInfo, bool]:
        info = await self.stop(job_id)
        await self.delete(job_id)
        return info, True

    async def wait(self, job_id: str, timeout: float) -> JobInfo:
        return self.jobs[job_id]

    async def delete(self, job_id: str, force: bool = False) -> None:
        self.removed.append(job_id)
        del self.jobs[job_id]


class FakeLocal(LocalProvider):
    def __init__(self, agent: FakeAgent):
        super().__init__()
        self._agent = agent

    async def agent(self, instance: Any) -> Any:
        return self._agent


def _no_ssh(*args: Any) -> Any:
    raise AssertionError("no SSH fleet here")


@pytest.mark.parametrize("keep", [False, True])
def test_a_retry_stops_the_run_but_keeps_its_recorded_jobs_a_delete_removes_them_all(
    keep: bool,
) -> None:
    run = entry(["flaky-0-0-200-abc123"], (FIRST,))
    agent = FakeAgent(
        [
            info("flaky-0-0-100-abc123", 100),  # the first attempt's
            info("flaky-0-0-200-abc123", 200, status="running"),  # the current one
            info("flaky-1-0-200-abc123", 200, status="running"),  # submitted, unrecorded
        ]
    )
    handler = RunHandler(
        FleetMachines(FakeLocal(agent), _no_ssh), SecretStore(Path(".")), DEPLOYMENT
    )
    asyncio.run(handler.delete(run, ApplyContext(), keep_recorded=keep))
    assert sorted(agent.stopped) == ["flaky-0-0-200-abc123", "flaky-1-0-200-abc123"]
    if keep:  # an ended attempt's jobs stay, with their logs; only the unrecorded one goes
        assert agent.removed == ["flaky-1-0-200-abc123"]
        assert set(agent.jobs) == {"flaky-0-0-100-abc123", "flaky-0-0-200-abc123"}
    else:
        assert agent.jobs == {}


def test_a_new_job_never_takes_the_id_of_a_kept_one() -> None:
    kept = Attempt.ended(1, [record("web-1-0-100-abc123")], now=1.0)
    run = entry(["web-0-0-100-abc123"], (kept,), generation=100)
    ctx = ApplyContext(clock=FakeClock(5.0))
    slot = [JobSlot(1, 0)]
    assert _unused_generation(100, "web", DEPLOYMENT, slot, run, ctx) == 5000
    assert _unused_generation(100, "web", DEPLOYMENT, [JobSlot(2, 0)], run, ctx) == 100
