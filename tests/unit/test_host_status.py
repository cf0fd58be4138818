"""A fleet host's status (`fleets/host_status.py`) and how `fleet list` and `/api/fleets` show
it (`inspect/fleets.py`): dstack's instance statuses, `busy` from the jobs its agent lists."""

from __future__ import annotations

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.metrics import host_families, render
from dstack_plan.agent.protocol import ALL_STATUSES
from dstack_plan.fleets.host_status import (
    INSTANCE_STATUSES,
    host_status,
    jobs_in_metrics,
    unfinished_jobs,
)
from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.inspect.fleets import asked, fleets_json, host_rows, top_answers
from dstack_plan.inspect.top import TopView, error_row
from dstack_plan.watch.metrics import INSTANCE_STATUSES as EXPORTED


@pytest.mark.parametrize(
    ("recorded", "jobs", "status"),
    [
        ("idle", 0, "idle"),
        ("idle", 3, "busy"),
        ("idle", None, "unreachable"),
        ("unknown", 1, "busy"),  # a record from before: its agent says
        ("unreachable", 0, "idle"),  # it answers again
        ("unreachable", None, "unreachable"),
        ("pending", None, "pending"),
        ("provisioning", 2, "provisioning"),
        ("terminating", 1, "terminating"),
        ("terminated", None, "terminated"),
    ],
)
def test_the_status_from_the_record_and_the_jobs(
    recorded: str, jobs: int | None, status: str
) -> None:
    assert host_status(recorded, jobs) == status


def test_the_statuses_are_dstack_s_and_watch_exports_each() -> None:
    assert INSTANCE_STATUSES == (
        "pending", "provisioning", "idle", "busy", "terminating", "terminated"
    )  # fmt: skip
    assert EXPORTED == INSTANCE_STATUSES


def _job(job_id: str, status: str) -> JobInfo:
    return JobInfo.model_validate(
        {"id": job_id, "run_name": "r", "runtime": "process", "status": status,
         "submitted_at": 0.0}
    )  # fmt: skip


def test_finished_jobs_do_not_make_a_host_busy() -> None:
    assert unfinished_jobs([_job("a", "done"), _job("b", "failed")]) == 0
    assert unfinished_jobs([_job("a", "done"), _job("b", "running"), _job("c", "pulling")]) == 2


def test_the_jobs_are_read_from_the_agent_s_metrics() -> None:
    def text(counts: dict[str, int]) -> str:
        return render(host_families(1.0, counts, [], {}, []))

    idle = dict.fromkeys(ALL_STATUSES, 0)
    assert jobs_in_metrics(text(idle)) == 0
    assert jobs_in_metrics(text({**idle, "done": 4, "terminated": 1})) == 0
    assert jobs_in_metrics(text({**idle, "running": 1, "submitted": 1, "done": 4})) == 2
    assert jobs_in_metrics("dstack_agent_uptime_seconds 1\n") is None  # not said: not known
    assert jobs_in_metrics('dstack_agent_jobs{status="running"} x\n') is None


def _host(name: str, status: str = "idle", problem: str | None = None) -> HostRecord:
    return HostRecord(name=name, hostname=name, status=status, problem=problem)


def test_fleet_list_shows_each_host_by_what_its_agent_answered() -> None:
    records = {
        "onprem": FleetRecord(
            hosts=(
                _host("busy1"),
                _host("idle1"),
                _host("gone", "unreachable", "gone: refused"),
                _host("down"),
                _host("new", "pending"),
            )
        )
    }
    answers = {
        ("onprem", "busy1"): 1,
        ("onprem", "idle1"): 0,
        ("onprem", "down"): "connection to down:22 refused",
    }
    hosts = fleets_json(records, answers)["fleets"][0]["hosts"]
    assert [(h["name"], h["status"]) for h in hosts] == [
        ("busy1", "busy"),
        ("idle1", "idle"),
        ("gone", "unreachable"),
        ("down", "unreachable"),
        ("new", "pending"),
    ]
    assert hosts[3]["problem"] == "connection to down:22 refused"  # why it did not answer now
    assert fleets_json(records, answers)["fleets"][0]["status"] == "degraded"
    assert [row[2] for row in host_rows(records, answers)] == [
        "busy",
        "idle",
        "unreachable: gone: refused",
        "unreachable: connection to down:22 refused",
        "pending",
    ]
    # only the hosts whose record says they are up are asked
    assert [h.name for h in records["onprem"].hosts if asked(h)] == ["busy1", "idle1", "down"]


def test_the_ui_takes_the_answers_of_its_top_snapshot() -> None:
    from dstack_plan.inspect.top import HostTop

    ok = HostTop(
        fleet="onprem", host="a", agent="ok", error=None, gpus_used=1, gpus_total=1,
        gpu_names=("A100",), memory_percent=1.0, cpu_percent=1.0, tasks=2, runs=("x", "y"),
    )  # fmt: skip
    view = TopView(
        taken_at=0.0,
        hosts=(ok, error_row("onprem", "b", (), "refused"), error_row("cloud", "", (), "no")),
    )
    assert top_answers(view) == {("onprem", "a"): 2, ("onprem", "b"): "refused"}
