"""A run that loses the race for a host's GPUs (`runs/admission.py`): what it submitted is
withdrawn, it is placed again and submitted again, a bounded number of times; when no host has
room any more it is `NoCapacity`, naming the conflict. Fake agents that hold jobs like the
real one (a refused job is not there; a delete of an unknown job is a 404)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from dstack_plan.agent.api_models import JobInfo, JobSpec, JobStatus
from dstack_plan.agent.client import AgentClient
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.config.runs import TaskSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError
from dstack_plan.fleets.machines import Machine
from dstack_plan.providers.base import Instance
from dstack_plan.runs.admission import CONFLICT, MAX_ATTEMPTS, admit
from dstack_plan.runs.jobs import slots
from dstack_plan.runs.queueing import NoCapacity
from dstack_plan.runs.submission import PlacedJob, RunSubmission, Submitted, submit_jobs

FLEET = "gpus"
BUSY = "gpus: asked for 2 GPUs but 2 are in use (free indices: none; in use: 0 by job x)"


class FakeAgent:
    """An agent that refuses the next `refusals` submits as busy (409 gpus_unavailable),
    answers each submit after `delay` turns of the event loop, and holds what it accepted."""

    def __init__(self, host: str, refusals: int = 0, delay: int = 0, code: str = "") -> None:
        self.host = host
        self.refusals = refusals
        self.delay = delay
        self.code = code or "gpus_unavailable"
        self.status = 409
        self.jobs: dict[str, JobSpec] = {}
        self.submits = 0
        self.withdrawn: list[str] = []
        """Ids deleted while the agent held them (deletes of unknown ids are 404s)."""

    async def submit(self, spec: JobSpec) -> JobInfo:
        self.submits += 1
        for _ in range(self.delay):
            await asyncio.sleep(0)
        if self.refusals:
            self.refusals -= 1
            raise AgentError(self.host, BUSY, self.status, self.code)
        self.jobs[spec.id] = spec
        return JobInfo(
            id=spec.id,
            run_name=spec.run_name,
            runtime="process",
            status=JobStatus.RUNNING,
            submitted_at=0.0,
        )

    async def delete(self, job_id: str, force: bool = False) -> None:
        assert force, "a withdrawn job is aborted, not left to its graceful window"
        if job_id not in self.jobs:
            raise AgentError(self.host, f"no job with id {job_id!r}", 404, "not_found")
        del self.jobs[job_id]
        self.withdrawn.append(job_id)


def machine(host: str) -> Machine:
    instance = Instance(provider="ssh", id=host, name=host, fleet=FLEET, hostname=host)
    return Machine(fleet=FLEET, provider="ssh", host=host, address=host, instance=instance)


def task(nodes: int = 1) -> TaskSpec:
    spec = {"type": "task", "name": "train", "commands": ["sleep 600"], "nodes": nodes,
            "resources": {"gpu": 2}}  # fmt: skip
    return TaskSpec.model_validate(spec)


class Harness:
    """`admit` wired to fake agents the way `RunHandler.start` wires it to real ones."""

    def __init__(self, tmp_path: Path, agents: Sequence[FakeAgent], nodes: int = 1) -> None:
        self.agents = {a.host: a for a in agents}
        self.spec = task(nodes)
        self.run = RunSubmission(self.spec, "train", "dep1", 1, SecretStore(tmp_path))
        self.placements: list[list[str]] = []
        """The hosts each re-placement was asked for answered (in slot order)."""
        self.next_places: list[list[str] | NoCapacity] = []
        self.progress: list[str] = []
        self.sleeps: list[float] = []

    async def place(self) -> list[Machine]:
        answer = self.next_places.pop(0)
        if isinstance(answer, NoCapacity):
            raise answer
        self.placements.append(answer)
        return [machine(h) for h in answer]

    async def submit(self, placed: Sequence[PlacedJob]) -> list[Submitted]:
        agents = {h: cast(AgentClient, a) for h, a in self.agents.items()}
        return await submit_jobs(self.run, placed, agents, ApplyContext())

    async def agent_of(self, host: str) -> AgentClient:
        return cast(AgentClient, self.agents[host])

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def admit(self, first: Sequence[str]) -> list[Submitted]:
        return asyncio.run(
            admit(
                self.run,
                slots(self.spec),
                [machine(h) for h in first],
                place=self.place,
                submit=self.submit,
                agent_of=self.agent_of,
                progress=self.progress.append,
                sleep=self.sleep,
            )
        )


def test_the_plans_hosts_go_first_and_a_lost_race_is_placed_elsewhere(tmp_path: Path) -> None:
    taken, free = FakeAgent("a", refusals=1), FakeAgent("b")
    harness = Harness(tmp_path, [taken, free])
    harness.next_places = [["b"]]

    jobs = harness.admit(["a"])

    assert [j.machine.host for j in jobs] == ["b"]
    assert (taken.submits, free.submits) == (1, 1)  # the plan's host first, then the new one
    assert not taken.jobs and list(free.jobs) == [jobs[0].info.id]
    assert harness.placements == [["b"]]
    assert len(harness.sleeps) == 1
    assert harness.progress == [f"{CONFLICT}: withdrawing, then placing again"]


def test_no_room_after_a_lost_race_is_no_capacity_naming_the_conflict(tmp_path: Path) -> None:
    taken = FakeAgent("a", refusals=1)
    harness = Harness(tmp_path, [taken])
    waits = "pending: waits for 2 GPUs on gpus (held by task.other)"
    harness.next_places = [NoCapacity(FLEET, waits, "task.train")]

    with pytest.raises(NoCapacity) as raised:
        harness.admit(["a"])

    assert raised.value.detail == f"{CONFLICT}; {waits}"
    assert raised.value.provider == FLEET and raised.value.resource == "task.train"
    assert "\n" not in str(raised.value)
    assert not taken.jobs


def test_losing_every_attempt_stops_after_the_bound(tmp_path: Path) -> None:
    taken = FakeAgent("a", refusals=MAX_ATTEMPTS + 3)
    harness = Harness(tmp_path, [taken])
    harness.next_places = [["a"]] * MAX_ATTEMPTS

    with pytest.raises(NoCapacity) as raised:
        harness.admit(["a"])

    assert taken.submits == MAX_ATTEMPTS
    assert len(harness.placements) == MAX_ATTEMPTS - 1  # no placement after the last loss
    assert raised.value.detail.startswith(f"{CONFLICT}; {MAX_ATTEMPTS} attempts in a row")
    assert BUSY in raised.value.detail


def test_a_partly_submitted_run_is_withdrawn_before_it_is_placed_again(tmp_path: Path) -> None:
    # node 0's host refuses at once; node 1's accepts a moment later: the withdrawal must
    # find node 1's job (not race its submit), or it would hold its GPUs for nothing
    first, second = FakeAgent("a", refusals=1), FakeAgent("b", delay=5)
    harness = Harness(tmp_path, [first, second], nodes=2)
    harness.next_places = [["a", "b"]]

    jobs = harness.admit(["a", "b"])

    assert len(second.withdrawn) == 1
    assert [j.machine.host for j in jobs] == ["a", "b"]
    assert sorted([*first.jobs, *second.jobs]) == sorted(j.info.id for j in jobs)
    assert (first.submits, second.submits) == (2, 2)


@pytest.mark.parametrize(("status", "code"), [(422, "gpus_unavailable"), (409, "conflict")])
def test_other_refusals_are_not_retried(tmp_path: Path, status: int, code: str) -> None:
    refusing = FakeAgent("a", refusals=1, code=code)
    refusing.status = status
    harness = Harness(tmp_path, [refusing])

    with pytest.raises(AgentError) as raised:
        harness.admit(["a"])

    assert (raised.value.status, raised.value.code) == (status, code)
    assert refusing.submits == 1 and not harness.placements and not harness.sleeps
