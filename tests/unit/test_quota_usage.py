"""Quota usage from state (runs/usage.py) and the records it reads (runs/records.py):
GPUs held, GPU-hours within the UTC day, shares, finished jobs, old records, the plan gate's
asks (runs/quota_gate.py)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.resource import Resource
from dstack_plan.config.runs import ServiceSpec, TaskSpec
from dstack_plan.errors import PlanError
from dstack_plan.plan.model import Action, Placement, Plan, ResourceChange
from dstack_plan.runs.quota_gate import QuotaHold, check_plan, hold_for_quota
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.runs.usage import day_start, namespace_usage, run_gpus
from dstack_plan.runs.user import USER_ENV, current_user
from dstack_plan.scheduler.quotas import Usage
from dstack_plan.state.model import ResourceState, State

MIDNIGHT = 1_800_057_600.0  # 2027-01-16 00:00:00 UTC
HOUR = 3600.0
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def job(
    job_id: str,
    status: str = "running",
    *,
    gpus: float | None = 1.0,
    started: float | None = None,
    finished: float | None = None,
    replica: int = 0,
) -> JobRecord:
    return JobRecord(
        job_id, replica=replica, status=status, gpus=gpus, started_at=started, finished_at=finished
    )


def run(
    name: str,
    jobs: list[JobRecord],
    *,
    namespace: str = "default",
    user: str | None = "alice",
    price: float = 0.0,
    spec: dict[str, Any] | None = None,
    kind: str = "task",
) -> ResourceState:
    record = RunRecord(
        generation=1, jobs=tuple(jobs), namespace=namespace, user=user, price_per_hour=price
    )
    return ResourceState.create(
        f"{kind}.{name}",
        provider="local",
        spec=spec or {"type": kind, "name": name, "commands": ["x"]},
        status="running",
        now=NOW,
        attributes=record.to_json(),
    )


def state(*runs: ResourceState) -> State:
    return State(lineage=str(uuid.uuid4()), resources={r.address: r for r in runs})


def test_midnight_constant_is_a_utc_midnight() -> None:
    assert datetime.fromtimestamp(MIDNIGHT, timezone.utc).strftime("%H:%M:%S") == "00:00:00"
    assert day_start(MIDNIGHT + 5 * HOUR) == MIDNIGHT
    assert day_start(MIDNIGHT - 1) == MIDNIGHT - 24 * HOUR


def test_gpu_hours_count_only_the_part_of_a_job_within_today() -> None:
    now = MIDNIGHT + 2 * HOUR
    began_yesterday = run("aa", [job("a0", gpus=2, started=MIDNIGHT - 5 * HOUR)])
    usage = namespace_usage(state(began_yesterday), now)
    # 2 GPUs for the 2 hours since midnight, not the 7 it has run
    assert usage[("default", None)] == Usage(gpus=2, gpu_hours_today=4.0, cost_per_hour=0.0)
    assert usage[("default", "alice")] == usage[("default", None)]


def test_a_job_that_ended_before_midnight_used_nothing_today_and_holds_nothing() -> None:
    ended = job("e0", "done", started=MIDNIGHT - 3 * HOUR, finished=MIDNIGHT - HOUR)
    assert namespace_usage(state(run("ee", [ended])), MIDNIGHT + HOUR) == {}


def test_a_finished_job_counts_its_hours_up_to_its_end_and_holds_no_gpus() -> None:
    start = MIDNIGHT + HOUR
    ended = job("f0", "terminated", gpus=4, started=start, finished=start + 0.5 * HOUR)
    usage = namespace_usage(state(run("ff", [ended], price=3.0)), MIDNIGHT + 10 * HOUR)
    assert usage[("default", None)] == Usage(gpus=0, gpu_hours_today=2.0, cost_per_hour=0.0)


def test_shares_count_as_fractions_and_cost_counts_per_running_run() -> None:
    now = MIDNIGHT + 4 * HOUR
    a = run("aa", [job("a0", gpus=0.25, started=now - 2 * HOUR)], price=1.5)
    b = run("bb", [job("b0", gpus=0.5, started=now - HOUR)], user="bob", price=2.0)
    usage = namespace_usage(state(a, b), now)
    assert usage[("default", None)] == Usage(0.75, 0.25 * 2 + 0.5 * 1, 3.5)
    assert usage[("default", "alice")] == Usage(0.25, 0.5, 1.5)
    assert usage[("default", "bob")] == Usage(0.5, 0.5, 2.0)


def test_namespaces_are_apart_and_a_run_without_user_counts_for_its_namespace_only() -> None:
    now = MIDNIGHT + HOUR
    dev = run("dd", [job("d0", gpus=1, started=now)], namespace="dev")
    prod = run("pp", [job("p0", gpus=3, started=now)], namespace="prod", user=None)
    usage = namespace_usage(state(dev, prod), now)
    assert list(usage) == [("dev", None), ("dev", "alice"), ("prod", None)]
    assert usage[("prod", None)].gpus == 3


def test_a_job_not_started_yet_holds_gpus_but_used_no_hours() -> None:
    waiting = run("ww", [job("w0", "submitted", gpus=2)])
    assert namespace_usage(state(waiting), MIDNIGHT + HOUR)[("default", None)] == Usage(2, 0, 0)


def test_released_runs_hold_nothing_but_what_they_used_today_counts() -> None:
    now = MIDNIGHT + 2 * HOUR
    a = run("aa", [job("a0", gpus=2, started=MIDNIGHT)], price=5.0)
    usage = namespace_usage(state(a), now, released={"task.aa"})
    assert usage[("default", None)] == Usage(0, 4.0, 0)


def test_old_records_read_with_defaults_and_gpus_from_the_spec() -> None:
    spec = {"type": "task", "name": "old", "commands": ["x"], "resources": {"gpu": 2}}
    raw = {"id": "o0", "status": "running", "replica": 0, "node": 0}
    entry = ResourceState.create(
        "task.old",
        provider="local",
        spec=TaskSpec.model_validate(spec).model_dump(mode="json", exclude_none=True),
        status="running",
        now=NOW,
        attributes={"fleet": "local", "generation": 1, "jobs": [raw]},
    )
    record = RunRecord.of(entry)
    assert (record.namespace, record.user) == ("default", None)
    assert record.jobs[0].gpus is None and record.jobs[0].started_at is None
    usage = namespace_usage(state(entry), MIDNIGHT)
    assert usage == {("default", None): Usage(2, 0, 0)}


def test_records_round_trip_and_refresh_keeps_the_times() -> None:
    record = RunRecord(jobs=(job("r0", gpus=0.5, started=10.0),), namespace="dev", user="bob")
    assert RunRecord.of(run("rr", list(record.jobs), namespace="dev", user="bob")) == RunRecord(
        generation=1, jobs=record.jobs, namespace="dev", user="bob"
    )
    assert "namespace" not in RunRecord().to_json()  # the default is not written
    info = JobInfo.model_validate(
        {"id": "r0", "run_name": "r", "runtime": "process", "status": "terminated",
         "submitted_at": 1.0, "finished_at": 20.0}
    )  # fmt: skip
    refreshed = record.jobs[0].refreshed(info)
    assert (refreshed.started_at, refreshed.finished_at, refreshed.gpus) == (10.0, 20.0, 0.5)
    assert JobRecord.from_json(refreshed.to_json()) == refreshed


@given(
    st.lists(
        st.tuples(
            st.floats(0, 4),
            st.floats(-48 * HOUR, 24 * HOUR),
            st.floats(0, 30 * HOUR),
            st.booleans(),
        ),
        max_size=8,
    ),
    st.floats(0, 24 * HOUR),
)
def test_hours_today_never_exceed_gpus_times_hours_since_midnight(
    jobs: list[tuple[float, float, float, bool]], into_day: float
) -> None:
    now = MIDNIGHT + into_day
    records = [
        job(f"j{i}", "done" if ended else "running", gpus=g, started=MIDNIGHT + s,
            finished=MIDNIGHT + s + d if ended else None)
        for i, (g, s, d, ended) in enumerate(jobs)
    ]  # fmt: skip
    usage = namespace_usage(state(run("pp", records)), now).get(("default", None), Usage())
    assert 0 <= usage.gpu_hours_today <= sum(g for g, *_ in jobs) * into_day / HOUR + 1e-6


def test_current_user_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(USER_ENV, "carol")
    assert current_user() == "carol"
    monkeypatch.setenv(USER_ENV, " ")
    assert current_user() not in ("", " ")


def test_run_gpus_counts_replicas_nodes_and_shares() -> None:
    nodes = TaskSpec.model_validate(
        {"type": "task", "name": "tt", "commands": ["x"], "nodes": 3, "resources": {"gpu": 2}}
    )
    assert run_gpus(nodes) == 6
    replicas = ServiceSpec.model_validate(
        {"type": "service", "name": "ss", "port": 80, "commands": ["x"], "replicas": 2,
         "resources": {"gpu": "25%"}}
    )  # fmt: skip
    assert run_gpus(replicas) == pytest.approx(0.5)


# -- the plan gate -----------------------------------------------------------------------


def quotas(tmp_path: Any, text: str) -> Any:
    (tmp_path / ".dstack").mkdir(exist_ok=True)
    (tmp_path / ".dstack" / "quotas.yml").write_text(text)
    return tmp_path


def change(name: str, gpus: int, action: Action = Action.CREATE, **fields: Any) -> ResourceChange:
    spec = TaskSpec.model_validate(
        {"type": "task", "name": name, "commands": ["x"], "resources": {"gpu": gpus}, **fields}
    )
    resource = Resource(kind="task", name=name, spec=spec, source=None)  # type: ignore[arg-type]
    return ResourceChange(
        address=f"task.{name}", kind="task", name=name, provider="local", action=action,
        after=resource.normalized, placement=Placement(fleet="local", provider="local"),
    )  # fmt: skip


def plan(*changes: ResourceChange) -> Plan:
    return Plan(lineage="", serial=0, changes=changes)


def test_a_plan_over_a_namespace_limit_names_it_and_one_under_passes(tmp_path: Any) -> None:
    project = quotas(tmp_path, "namespaces:\n  default: {gpus: 4}\n")
    held = state(run("aa", [job("a0", gpus=2, started=MIDNIGHT)]))
    check_plan(plan(change("bb", 2)), held, project, MIDNIGHT + HOUR, user="alice")
    with pytest.raises(PlanError) as e:
        check_plan(plan(change("bb", 3)), held, project, MIDNIGHT + HOUR, user="alice")
    assert str(e.value) == "namespace default: gpus limit 4, 2 in use, task.bb asks 3"


def test_a_replaced_run_does_not_count_twice_and_a_kept_one_asks_nothing(tmp_path: Any) -> None:
    project = quotas(tmp_path, "namespaces:\n  default: {gpus: 4}\n")
    held = state(run("aa", [job("a0", gpus=3, started=MIDNIGHT)]))
    now = MIDNIGHT + HOUR
    check_plan(plan(change("aa", 4, Action.DELETE_THEN_CREATE)), held, project, now)
    check_plan(plan(change("aa", 3, Action.NOOP)), held, project, now)
    with pytest.raises(PlanError):
        check_plan(plan(change("aa", 5, Action.DELETE_THEN_CREATE)), held, project, now)


def test_a_scheduled_task_asks_nothing_at_plan_time(tmp_path: Any) -> None:
    project = quotas(tmp_path, "namespaces:\n  default: {gpus: 1}\n")
    nightly = change("nn", 2, schedule={"cron": "0 1 * * *"})
    check_plan(plan(nightly), state(), project, MIDNIGHT)


def test_no_quota_file_checks_nothing(tmp_path: Any) -> None:
    check_plan(plan(change("bb", 100)), state(), tmp_path, MIDNIGHT)


def test_a_queued_run_is_held_while_its_user_used_the_day(tmp_path: Any) -> None:
    project = quotas(tmp_path, "namespaces:\n  dev:\n    per_user: {gpu_hours_per_day: 1}\n")
    used = job("a0", "done", started=MIDNIGHT, finished=MIDNIGHT + HOUR)
    spent = run("aa", [used], namespace="dev")
    spec = TaskSpec.model_validate(
        {"type": "task", "name": "qq", "commands": ["x"], "namespace": "dev",
         "resources": {"gpu": 1}}
    ).model_dump(mode="json", exclude_none=True)  # fmt: skip
    queued = run("qq", [], namespace="dev", spec=spec)
    with pytest.raises(QuotaHold) as e:
        hold_for_quota(project, state(spent, queued), queued, MIDNIGHT + 2 * HOUR)
    assert "namespace dev, user alice: gpu_hours_per_day limit 1, 1 used today" in e.value.detail
    hold_for_quota(project, state(spent, queued), queued, MIDNIGHT + 25 * HOUR)  # a new day
