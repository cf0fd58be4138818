"""Submissions (`apply -f`, the SDK) against declarations (a directory apply): what each
plan keeps, deletes and records, and how the engine records it."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dstack_plan.apply import records
from dstack_plan.apply.handlers import Outcome
from dstack_plan.config.loader import load_project
from dstack_plan.errors import ConfigError
from dstack_plan.graph.references import dependencies
from dstack_plan.plan.json_plan import plan_to_json
from dstack_plan.plan.model import Action
from dstack_plan.plan.planner import PlanInputs, PlanOptions, make_plan
from dstack_plan.plan.submissions import expired, finished_at, with_state_context
from dstack_plan.project import Project
from dstack_plan.state.model import ResourceState, State
from tests.unit.test_planner import NOW, actions, desired_items, plan, state_of

A = "type: task\nname: ta\ncommands: [echo a]\n"
B = "type: task\nname: tb\ncommands: [echo b]\n"
POOL = "type: fleet\nname: pool\nssh_config:\n  user: u\n  hosts: [h1]\n"
ON_POOL = "type: task\nname: tc\ncommands: [echo c]\nfleets: [pool]\n"


def _submitted(state: State, *addresses: str) -> State:
    for address in addresses:
        entry = state.resources[address]
        state = state.with_resource(entry.updated(now=entry.updated_at, submitted=True))
    return state


def test_a_submission_creates_what_it_is_given_and_deletes_nothing(tmp_path: Path) -> None:
    both = desired_items(tmp_path / "both", A + "---\n" + B)
    state = state_of([i for i in both if i.address == "task.tb"])
    given = [i for i in both if i.address == "task.ta"]
    p = plan(given, state, submission=True)
    assert actions(p) == {"task.ta": Action.CREATE}  # task.tb is not even mentioned
    assert p.change("task.ta").submitted is True
    assert p.submission and not p.kept
    # the same files as a directory plan: Terraform's way, task.tb goes
    assert actions(plan(given, state)) == {"task.ta": Action.CREATE, "task.tb": Action.DELETE}


def test_a_directory_plan_keeps_submitted_resources_and_prune_deletes_them(
    tmp_path: Path,
) -> None:
    both = desired_items(tmp_path, A + "---\n" + B)
    state = _submitted(state_of(both), "task.tb")
    declared_a = [i for i in both if i.address == "task.ta"]
    kept = plan(declared_a, state)
    assert actions(kept) == {"task.ta": Action.NOOP}
    assert kept.kept == ("task.tb",) and not kept.has_changes
    assert plan_to_json(kept)["kept_submitted"] == ["task.tb"]
    pruned = plan(declared_a, state, prune=True)
    assert actions(pruned)["task.tb"] is Action.DELETE
    assert "--prune" in (pruned.change("task.tb").reason or "")
    # destroy takes everything, submitted or declared
    assert set(actions(plan(declared_a, state, destroy=True))) == {"task.ta", "task.tb"}


def test_a_directory_plan_that_finds_a_submitted_resource_declares_it(tmp_path: Path) -> None:
    items = desired_items(tmp_path, A)
    state = _submitted(state_of(items), "task.ta")
    p = plan(items, state)
    change = p.change("task.ta")
    assert change.action is Action.NOOP and change.submitted is False and change.origin_only
    assert p.has_changes  # apply must run to record it, so a later removal destroys it
    # once recorded as declared, the same plan has nothing to do
    assert not plan(items, state_of(items)).has_changes


def test_a_submission_updating_a_declared_resource_leaves_it_declared(tmp_path: Path) -> None:
    old = desired_items(tmp_path / "old", A)
    new = desired_items(tmp_path / "new", A.replace("echo a", "echo A"))
    p = plan(new, state_of(old), submission=True)
    assert p.change("task.ta").action is Action.DELETE_THEN_CREATE
    assert p.change("task.ta").submitted is False
    resubmitted = plan(new, _submitted(state_of(old), "task.ta"), submission=True)
    assert resubmitted.change("task.ta").submitted is True


def test_the_engine_records_what_the_plan_says(tmp_path: Path) -> None:
    items = desired_items(tmp_path, A)
    change = plan(items, State.empty(), submission=True).change("task.ta")
    intent = records.intent(change, NOW)
    assert intent.submitted  # a submission killed mid-create is not taken for declared
    done = records.created(change, Outcome(status="running", attributes={}), NOW, intent)
    assert done.submitted
    # watch's in-place changes (no word on the origin) keep it
    in_place = type(change).in_place(done)
    assert records.updated(in_place, Outcome(status="running", attributes={}), NOW, done).submitted
    declared = plan(items, State.empty().with_resource(done)).change("task.ta")
    assert (
        records.put_origin(declared, NOW)(State.empty().with_resource(done))
        .resources["task.ta"]
        .submitted
        is False
    )


def test_state_writes_the_flag_only_when_set() -> None:
    entry = ResourceState.create("task.ta", provider="local", spec={}, status="done", now=NOW)
    assert "submitted" not in entry.model_dump(mode="json")
    marked = entry.updated(now=NOW, submitted=True)
    assert marked.model_dump(mode="json")["submitted"] is True
    assert ResourceState.model_validate(marked.model_dump(mode="json")).submitted


def test_submitted_runs_name_fleets_the_state_holds(tmp_path: Path) -> None:
    (tmp_path / "fleet.dstack.yml").write_text(POOL)
    (tmp_path / "c.dstack.yml").write_text(ON_POOL)
    project_items = desired_items(tmp_path / "all", POOL + "---\n" + ON_POOL)
    state = state_of([i for i in project_items if i.kind == "fleet"])
    given = load_project(tmp_path, [str(tmp_path / "c.dstack.yml")])
    with pytest.raises(ConfigError, match="neither in the files given nor in the project's st"):
        dependencies(with_state_context(given, State.empty()).desired, tmp_path)
    found = with_state_context(given, state)
    assert set(found.context) == {"fleet.pool"}
    assert dependencies(found.desired, tmp_path)["task.tc"] == ("fleet.pool",)


def test_a_submission_plans_against_its_context_and_never_changes_it(tmp_path: Path) -> None:
    (tmp_path / "fleet.dstack.yml").write_text("type: fleet\nname: pool\nnodes: 1\n")
    (tmp_path / "c.dstack.yml").write_text(ON_POOL)
    # the fleet was applied earlier, with another spec than its file has now
    applied = "type: fleet\nname: pool\nnodes: 2\n"
    fleet = desired_items(tmp_path / "earlier", applied)
    state = state_of(fleet)
    project = Project(tmp_path, (str(tmp_path / "c.dstack.yml"),), state_path=tmp_path / "s")
    options = project._submission_options(state, PlanOptions())
    items = {i.address: i for i in project.desired_items()}
    assert items["fleet.pool"].spec == state.resources["fleet.pool"].spec
    p = make_plan(PlanInputs(desired=list(items.values()), state=state, state_exists=True,
                             options=options))  # fmt: skip
    assert actions(p) == {"task.tc": Action.CREATE}
    assert p.change("task.tc").depends_on == ("fleet.pool",)
    with pytest.raises(Exception, match="does not go with -f"):
        project._submission_options(state, PlanOptions(prune=True))


def test_finished_submitted_runs_expire_after_their_retention(tmp_path: Path) -> None:
    items = desired_items(tmp_path, A + "---\n" + B)
    state = _submitted(state_of(items, status="done"), "task.ta")
    end = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    a = state.resources["task.ta"]
    assert finished_at(a, [end - 10, None, end]) == end
    assert finished_at(a, []) == a.updated_at.timestamp()
    running = a.updated(now=NOW, status="running")
    assert finished_at(running, [end]) is None
    ended = {"task.ta": end, "task.tb": end}  # task.tb is declared: its files decide
    assert expired(ended, state, end + 23 * 3600, 24 * 3600) == {}
    gone = expired(ended, state, end + 25 * 3600, 24 * 3600)
    assert list(gone) == ["task.ta"] and "finished 25h ago" in gone["task.ta"]
    assert expired(ended, state, end + 999 * 3600, None) == {}  # retention off
    # a directory plan and a submission alike remove it, saying why
    for options in ({}, {"submission": True}):
        p = make_plan(
            PlanInputs(desired=[i for i in items if i.address == "task.tb"], state=state,
                       state_exists=True, expired=gone, options=PlanOptions(**options))
        )  # fmt: skip
        assert p.change("task.ta").action is Action.DELETE
        assert p.change("task.ta").reason == gone["task.ta"]


def test_retention_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    from dstack_plan.errors import PlanError
    from dstack_plan.plan.submissions import submitted_retention

    monkeypatch.delenv("DSTACK_PLAN_SUBMITTED_RETENTION", raising=False)
    assert submitted_retention() == 24 * 3600
    monkeypatch.setenv("DSTACK_PLAN_SUBMITTED_RETENTION", "3d")
    assert submitted_retention() == 3 * 24 * 3600
    monkeypatch.setenv("DSTACK_PLAN_SUBMITTED_RETENTION", "off")
    assert submitted_retention() is None
    monkeypatch.setenv("DSTACK_PLAN_SUBMITTED_RETENTION", "soon")
    with pytest.raises(PlanError, match="DSTACK_PLAN_SUBMITTED_RETENTION"):
        submitted_retention()


def test_sdk_submission_reads_no_file_of_the_directory(tmp_path: Path) -> None:
    from dstack_plan.sdk.builders import Task

    (tmp_path / "broken.dstack.yml").write_text("type: task\nname: [\n")
    built = Task(name="xx", commands=["true"]).resource()
    project = Project(tmp_path, configs=[built], submit=True, state_path=tmp_path / "s.json")
    assert list(project.load().resources) == ["task.xx"]
    p, _ = asyncio.run(project.plan())
    assert actions(p) == {"task.xx": Action.CREATE}
