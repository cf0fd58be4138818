"""The plan promises only what apply can do (issue 11).

- a resource whose provider cannot create it, and whatever depends on it, is a plan error;
- a create that failed leaves nothing to destroy, so prevent_destroy does not block later plans;
- a service or dev environment whose jobs failed by themselves is drift, replaced by the plan;
- a run with a failed replica is `failed`, not `running`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo, TerminationReason
from dstack_plan.apply.engine import apply_plan
from dstack_plan.apply.handlers import ApplyContext, Outcome, ResourceHandler
from dstack_plan.apply.unsupported import UnsupportedHandler
from dstack_plan.clock import FakeClock
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError, PlanError, ProviderError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.plan.model import Action, Crash, Plan, ResourceChange
from dstack_plan.plan.planner import DesiredItem, PlanInputs, PlanOptions, make_plan
from dstack_plan.project import Project
from dstack_plan.providers.local import LocalProvider
from dstack_plan.runs.handler import RunHandler, run_status
from dstack_plan.state import LocalBackend, ResourceState, State

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SSH = "the ssh provider cannot create fleets in this version"


def item(address: str, provider: str = "local", *deps: str, **spec: Any) -> DesiredItem:
    kind, name = address.split(".", 1)
    return DesiredItem(address, kind, name, provider, {"name": name, **spec}, deps)


def entry(address: str, provider: str = "local", **fields: Any) -> ResourceState:
    spec = fields.pop("spec", {"name": address.split(".", 1)[1]})
    fields.setdefault("status", "running")
    return ResourceState.create(address, provider=provider, spec=spec, now=NOW, **fields)


def state_of(*entries: ResourceState) -> State:
    state = State.empty()
    for e in entries:
        state = state.with_resource(e)
    return state


def plan(
    desired: Sequence[DesiredItem], state: State, **inputs: Any
) -> Plan:  # state_exists: the state was read
    options = PlanOptions(**inputs.pop("options", {}))
    return make_plan(PlanInputs(desired, state, True, options=options, **inputs))


# --- 1. what no provider of this version can create ---------------------------------------

FLEETS = {("fleet", "ssh"): SSH, ("volume", "aws"): "no volumes here"}


def test_a_resource_its_provider_cannot_create_is_refused_with_its_dependents() -> None:
    desired = [
        item("fleet.onprem", "ssh"),
        item("volume.data", "aws"),
        item("task.train", "ssh", "fleet.onprem"),
        item("service.web", "local", "volume.data"),
        item("task.free"),
    ]
    with pytest.raises(PlanError) as info:
        plan(desired, State.empty(), unsupported=FLEETS)
    message = str(info.value)
    assert message.startswith("4 resources cannot be applied by this version")
    assert f"  fleet.onprem: {SSH}\n" in message
    assert "  volume.data: no volumes here\n" in message
    assert "  task.train: depends on fleet.onprem, which cannot be applied\n" in message
    assert "  service.web: depends on volume.data, which cannot be applied\n" in message
    assert "task.free" not in message


def test_without_unsupported_resources_the_same_plan_creates_them() -> None:
    desired = [item("fleet.onprem", "ssh"), item("task.train", "ssh", "fleet.onprem")]
    assert plan(desired, State.empty()).summary() == "Plan: 2 to add, 0 to change, 0 to destroy."
    # another provider of the same kind is not refused
    assert plan([item("fleet.cloud", "aws")], State.empty(), unsupported=FLEETS).has_changes


def test_an_update_of_an_unsupported_resource_is_refused_but_a_noop_is_not() -> None:
    current = entry("fleet.onprem", "ssh", spec={"name": "onprem", "nodes": 1})
    same = [item("fleet.onprem", "ssh", nodes=1)]
    assert plan(same, state_of(current), unsupported=FLEETS).changes[0].action is Action.NOOP
    with pytest.raises(PlanError, match="fleet.onprem: the ssh provider"):
        plan([item("fleet.onprem", "ssh", nodes=2)], state_of(current), unsupported=FLEETS)


def test_deleting_an_unsupported_resource_from_state_is_planned() -> None:
    state = state_of(
        entry("fleet.onprem", "ssh"),
        entry("task.train", "ssh", depends_on=("fleet.onprem",)),
    )
    for p in (
        plan([], state, unsupported=FLEETS),
        plan([], state, unsupported=FLEETS, options={"destroy": True}),
    ):
        assert {c.address: c.action for c in p.changes} == {
            "task.train": Action.DELETE,
            "fleet.onprem": Action.DELETE,
        }


def test_handlers_say_what_they_cannot_create() -> None:
    assert UnsupportedHandler().cannot_create("gateway", "aws") == (
        "the aws provider cannot create gateways in this version"
    )
    runs = RunHandler(FleetMachines(LocalProvider(), _no_ssh), SecretStore(Path(".")), "abc")
    assert runs.cannot_create("task", "local") is None
    assert runs.cannot_create("service", "ssh") is None
    assert runs.cannot_create("task", "aws") is None  # on a cloud fleet's booted hosts
    assert runs.cannot_create("task", "vastai") == (
        "the vastai provider cannot run tasks in this version (only the local fleet, SSH "
        "fleets and cloud fleets)"
    )


def _no_ssh(*args: object) -> Any:
    raise AssertionError("no SSH fleet here")


SSH_PROJECT = """type: fleet
name: onprem
ssh_config:
  user: ubuntu
  hosts: [10.0.0.1]
---
type: task
name: train
fleets: [onprem]
commands: [python train.py]
---
type: volume
name: data
backend: aws
region: us-east-1
size: 10GB
---
type: gateway
name: gw
backend: aws
region: us-east-1
domain: example.com
---
type: fleet
name: cloud
nodes: 1
"""


def test_the_project_plan_refuses_unconfigured_cloud_fleets_volumes_and_gateways_at_once(
    tmp_path: Path,
) -> None:
    # SSH fleets and runs on them are applied (tests/e2e/test_ssh_fleet.py, test_ssh_runs.py)
    (tmp_path / "p.dstack.yml").write_text(SSH_PROJECT)
    project = Project(tmp_path, state_path=tmp_path / "state.json", agent_dir=tmp_path / "a")
    with pytest.raises(PlanError) as info:
        asyncio.run(project.plan())
    lines = str(info.value).splitlines()
    assert lines[0] == "3 resources cannot be applied by this version of dstack-plan:"
    assert lines[1:4] == [
        "  fleet.cloud: a cloud backend is not configured in .dstack/backends.yml (dstack init "
        "--backend aws)",
        "  gateway.gw: the aws provider cannot create gateways in this version: declare a "
        "one-node cloud fleet and put the gateway on its machine (backend: ssh, fleet: NAME; "
        "see docs/services.md)",
        "  volume.data: aws: not configured in .dstack/backends.yml (dstack init --backend aws)",
    ]
    assert not (tmp_path / "a").exists()  # refused before any agent was asked


def test_destroy_removes_what_state_holds_of_an_unsupported_kind(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    backend = LocalBackend(path)
    backend.write(state_of(entry("fleet.onprem", "ssh"), entry("gateway.gw", "aws")), "absent")
    project = Project(tmp_path, state_path=path, agent_dir=tmp_path / "a")
    destroy, _ = asyncio.run(project.plan(PlanOptions(destroy=True)))
    assert destroy.summary() == "Plan: 0 to add, 0 to change, 2 to destroy."
    report = asyncio.run(project.apply(destroy))
    assert report.ok and backend.read().state.resources == {}


# --- 2. a failed create does not poison later plans --------------------------------------


class FailingCreate(ResourceHandler):
    """A provider whose creates fail; deletes are recorded."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        raise ProviderError(change.provider, "quota exceeded", change.address)

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        raise AssertionError("not planned")

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        self.deleted.append(current.address)


def failed_volume(tmp_path: Path) -> tuple[LocalBackend, FailingCreate, list[DesiredItem]]:
    """A protected volume whose create failed, through the real engine and state backend."""
    backend = LocalBackend(tmp_path / "state.json")
    desired = [item("volume.data", "aws", size=10)]
    handler = FailingCreate()
    first = plan(desired, State.empty())
    report = asyncio.run(
        apply_plan(first, backend, {"volume": handler}, ApplyContext(clock=FakeClock()))
    )
    assert not report.ok
    left = backend.read().state.resources["volume.data"]
    assert left.tainted and left.status == "creating"
    return backend, handler, desired


def test_after_a_failed_create_the_next_plan_creates_it_again(tmp_path: Path) -> None:
    backend, _, desired = failed_volume(tmp_path)
    again = plan(desired, backend.read().state)  # the volume is protected by default
    change = again.changes[0]
    assert change.action is Action.DELETE_THEN_CREATE
    assert change.reason == (
        "tainted (its create did not complete: nothing was created to destroy)"
    )


def test_a_never_created_protected_object_can_be_removed_and_destroyed(tmp_path: Path) -> None:
    backend, handler, _ = failed_volume(tmp_path)
    state = backend.read().state
    assert plan([], state).changes[0].action is Action.DELETE
    destroy = plan([], state, options={"destroy": True})
    report = asyncio.run(
        apply_plan(destroy, backend, {"volume": handler}, ApplyContext(clock=FakeClock()))
    )
    assert report.ok and handler.deleted == ["volume.data"]  # may clean up a partial create
    assert backend.read().state.resources == {}


def test_a_created_or_deposed_protected_object_stays_protected() -> None:
    created = entry("volume.data", "aws", spec={"name": "data", "size": 10}, tainted=True)
    with pytest.raises(PlanError, match="prevent_destroy forbids destroying it"):
        plan([], state_of(created))  # tainted after a create that returned: it exists
    old = entry("volume.data", "aws").model_dump(mode="json")
    intent = entry("volume.data", "aws", status="creating", tainted=True)
    intent = intent.updated(now=NOW, attributes={"_deposed": [old]})
    with pytest.raises(PlanError, match="prevent_destroy forbids destroying it"):
        plan([], state_of(intent))  # the deposed object still holds the data


# --- 3 and 4. crashed runs: failed, and drift the plan repairs --------------------------


def job(
    job_id: str,
    status: str,
    reason: TerminationReason | None = None,
    message: str | None = None,
    exit_code: int | None = None,
) -> JobInfo:
    return JobInfo(
        id=job_id,
        run_name="llm",
        runtime="process",
        status=status,
        termination_reason=reason,
        termination_message=message,
        exit_code=exit_code,
        submitted_at=1.0,
    )


EXITED = TerminationReason.CONTAINER_EXITED_WITH_ERROR


class FakeAgent:
    def __init__(self, *jobs: JobInfo) -> None:
        self.jobs = {j.id: j for j in jobs}

    async def list_jobs(self, status: Any = None, run_name: Any = None) -> list[JobInfo]:
        return list(self.jobs.values())

    async def get_job(self, job_id: str) -> JobInfo:
        if job_id not in self.jobs:
            raise AgentError("localhost", f"no job {job_id}", 404)
        return self.jobs[job_id]


class FakeLocal(LocalProvider):
    """This machine's provider, with a fake agent."""

    def __init__(self, agent: FakeAgent) -> None:
        super().__init__()
        self._agent = agent

    async def agent(self, instance: Any) -> Any:
        return self._agent

    async def close(self) -> None:
        return None


def run_entry(address: str, *job_ids: str, status: str = "running") -> ResourceState:
    jobs = [{"id": j, "replica": i, "node": 0, "status": "running"} for i, j in enumerate(job_ids)]
    return entry(address, status=status, attributes={"fleet": "local", "jobs": jobs})


def refreshed(current: ResourceState, *jobs: JobInfo) -> Any:
    local = FakeLocal(FakeAgent(*jobs))
    runs = RunHandler(FleetMachines(local, _no_ssh), SecretStore(Path(".")), "abc")
    return asyncio.run(runs.refresh_many([current], ApplyContext()))[current.address]


def test_a_run_with_a_failed_replica_is_failed_not_running() -> None:
    running = job("a", "running")
    failed = job("b", "failed", EXITED, "exited with code 1", 1)
    assert run_status([running, failed]) == "failed"
    assert run_status([running, job("c", "pulling")]) == "running"


def test_a_crashed_service_is_drift_with_the_job_and_its_exit_code() -> None:
    found = refreshed(
        run_entry("service.llm", "x0", "x1"),
        job("x0", "failed", EXITED, "exited with code 1", 1),
        job("x1", "failed", EXITED, "exited with code 2", 2),
    )
    assert found.status == "failed" and found.gone is None
    assert found.crashed == Crash(
        "service crashed (job llm-0-0 exited with code 1, and 1 more)", active=False
    )


def test_a_partly_crashed_service_says_that_replicas_still_run() -> None:
    found = refreshed(
        run_entry("service.llm", "x0", "x1"),
        job("x0", "running"),
        job("x1", "failed", TerminationReason.CREATING_CONTAINER_ERROR, "no such image"),
    )
    assert found.status == "failed"
    assert found.crashed == Crash("service crashed (job llm-1-0 failed: no such image)", True)


def test_a_stopped_service_and_a_failed_task_are_not_drift() -> None:
    stopped = job("s0", "terminated", TerminationReason.TERMINATED_BY_USER, "stopped by user")
    failed = job("s1", "failed", EXITED, "exited with code 143", 143)
    found = refreshed(run_entry("service.llm", "s0", "s1"), stopped, failed)
    assert found.crashed is None  # the user stopped it: it stays stopped
    task = refreshed(run_entry("task.llm", "t0"), job("t0", "failed", EXITED, "exit", 1))
    assert task.status == "failed" and task.crashed is None  # a finished task is a result
    dev = refreshed(
        run_entry("dev-environment.llm", "d0"),
        job("d0", "aborted", TerminationReason.ABORTED_BY_USER),
    )
    assert dev.crashed is None


def test_the_plan_replaces_a_crashed_service_with_the_reason() -> None:
    current = entry("service.llm", status="failed")
    crash = Crash("service crashed (job llm-0-0 exited with code 1)")
    p = plan([item("service.llm")], state_of(current), crashed={"service.llm": crash})
    change = p.changes[0]
    assert change.action is Action.DELETE_THEN_CREATE
    assert change.reason == "drift: service crashed (job llm-0-0 exited with code 1)"
    assert plan([item("service.llm")], state_of(current)).changes[0].action is Action.NOOP


def test_prevent_destroy_guards_a_crashed_run_only_while_some_of_it_runs() -> None:
    spec = {"name": "llm", "lifecycle": {"prevent_destroy": True}}
    current = entry("service.llm", status="failed", spec=spec)
    desired = [item("service.llm", lifecycle={"prevent_destroy": True})]
    dead = Crash("service crashed (job llm-0-0 exited with code 1)")
    p = plan(desired, state_of(current), crashed={"service.llm": dead})
    assert p.changes[0].action is Action.DELETE_THEN_CREATE  # nothing alive is destroyed
    alive = dead._replace(active=True)
    with pytest.raises(PlanError, match="prevent_destroy forbids destroying it"):
        plan(desired, state_of(current), crashed={"service.llm": alive})


def test_project_refresh_reports_crashed_runs_to_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    LocalBackend(path).write(state_of(run_entry("service.llm", "x0")), "absent")
    project = Project(tmp_path, state_path=path, agent_dir=tmp_path / "a")
    project.machines.implicit = FakeLocal(
        FakeAgent(job("x0", "failed", EXITED, "exited with code 1", 1))
    )
    refresh = asyncio.run(project.refresh())
    assert refresh.drift == {}
    assert refresh.crashed == {
        "service.llm": Crash("service crashed (job llm-0-0 exited with code 1)")
    }
    assert refresh.state.resources["service.llm"].status == "failed"
