"""Watch's commits yield to apply's, and its gang rule (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from dstack_plan.config.runs import TaskSpec
from dstack_plan.runs.gang import gang_leftovers
from dstack_plan.runs.records import JobRecord
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.record import Observed, record_observed

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def run(address: str, status: str, at: datetime) -> ResourceState:
    return ResourceState.create(
        address, provider="local", spec={"name": address.split(".")[1]}, status=status, now=at
    )


def test_observed_statuses_are_written_unless_apply_changed_the_entry_since() -> None:
    kept, touched = run("task.a", "submitted", T0), run("task.b", "submitted", T0)
    read = {r.address: r.updated_at for r in (kept, touched)}
    state = State.empty().with_resource(kept).with_resource(touched)
    # apply replaced task.b after the tick read it
    newer = touched.updated(now=T0 + timedelta(seconds=1), status="running", attributes={})
    state = state.with_resource(newer)
    mutate = record_observed(
        {
            "task.a": Observed(read["task.a"], "failed", {"jobs": []}),
            "task.b": Observed(read["task.b"], "failed", {"jobs": []}),
            "task.gone": Observed(T0, "failed", {}),
        },
        T0 + timedelta(seconds=2),
    )
    after = mutate(state)
    assert after.resources["task.a"].status == "failed"
    assert after.resources["task.b"].status == "running"  # apply's newer word wins
    assert "task.gone" not in after.resources


def jobs(*statuses: str) -> list[JobRecord]:
    return [JobRecord(id=f"j{n}", node=n, status=s) for n, s in enumerate(statuses)]


def spec(**extra: object) -> TaskSpec:
    return TaskSpec.model_validate({"name": "train", "nodes": 3, "commands": ["x"], **extra})


def test_a_failed_node_stops_the_running_ones_and_master_done_stops_workers() -> None:
    stops, why = gang_leftovers(spec(), jobs("running", "failed", "running"))
    assert [j.id for j in stops] == ["j0", "j2"] and why and "node 1 failed" in why
    assert gang_leftovers(spec(), jobs("done", "running", "running")) == ([], None)
    stops, why = gang_leftovers(spec(stop_criteria="master-done"), jobs("done", "running", "done"))
    assert [j.id for j in stops] == ["j1"] and why and "master-done" in why
    single = TaskSpec.model_validate({"name": "train", "commands": ["x"]})
    assert gang_leftovers(single, jobs("failed")) == ([], None)
