"""`dstack top`'s view: readings from the agent's real metrics text and job records, the
fleets it shows, and its table cells."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.metrics import Family, host_families, render
from dstack_plan.inspect.top import (
    HEADERS,
    TopView,
    error_lines,
    error_row,
    host_row,
    table_rows,
    top_fleets,
)
from dstack_plan.inspect.top_sample import cpu_percent, parse_metrics, reading
from dstack_plan.state.model import ResourceState, State

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def job(job_id: str, run: str, status: str, gpus: list[int]) -> JobInfo:
    return JobInfo.model_validate(
        {
            "id": job_id,
            "run_name": run,
            "runtime": "process",
            "status": status,
            "submitted_at": 1.0,
            "gpus": gpus,
        }
    )


def cpu_text(user: float, idle: float, iowait: float = 0.0) -> str:
    cpu = Family("dstack_agent_cpu_seconds_total", "counter", "CPU time")
    cpu.add(user, mode="user").add(idle, mode="idle").add(iowait, mode="iowait")
    return render([cpu])


def test_a_reading_of_the_agents_own_metrics_counts_allocated_gpus_and_live_jobs() -> None:
    text = render(
        host_families(
            uptime=5.0,
            job_counts={"running": 1, "done": 1},
            gpu_usage=[],
            allocations={1: "train-0-0-0"},
            gpu_indices=[0, 1],
        )
    )
    jobs = [
        job("old-0-0-0", "old", "done", []),
        job("train-0-0-0", "train", "running", [1]),
        job("eval-0-0-0", "eval", "submitted", []),
    ]
    found = reading(text, jobs)
    assert (found.gpus_used, found.gpus_total) == (1, 2)
    assert found.runs == ("train", "eval")  # the finished job is no task
    assert found.memory_percent is not None and 0 < found.memory_percent < 100
    assert found.cpu_total_s is not None and found.cpu_busy_s is not None
    assert 0 <= found.cpu_busy_s <= found.cpu_total_s


def test_a_host_without_gpus_reads_zero_of_zero() -> None:
    text = render(host_families(1.0, {}, [], {}, []))
    found = reading(text, [])
    assert (found.gpus_used, found.gpus_total, found.runs) == (0, 0, ())


def test_cpu_percent_is_the_working_share_of_cpu_time_between_readings() -> None:
    before = reading(cpu_text(user=100, idle=100), [])
    after = reading(cpu_text(user=130, idle=160, iowait=10), [])
    assert cpu_percent(before, after) == 30.0  # 30 s of work in 100 s of CPU time
    assert cpu_percent(after, after) is None  # no time passed
    no_cpu = reading("", [])
    assert cpu_percent(no_cpu, after) is None


def test_memory_percent_is_what_is_not_available() -> None:
    text = render(
        [
            Family("dstack_agent_memory_total_bytes", "gauge", "m").add(1000),
            Family("dstack_agent_memory_available_bytes", "gauge", "m").add(250),
        ]
    )
    assert reading(text, []).memory_percent == 75.0


def test_parse_metrics_reads_escaped_labels_and_skips_what_it_cannot_read() -> None:
    text = render([Family("x", "gauge", "X").add(2, job='a"b\\c', gpu=0)])
    text += 'not a sample\nbad_value{a="1"} NaNx\n'
    assert parse_metrics(text) == {"x": [({"gpu": "0", "job": 'a"b\\c'}, 2.0)]}


def fleet_entry(name: str, provider: str = "ssh", tainted: bool = False) -> ResourceState:
    return ResourceState.create(
        f"fleet.{name}",
        provider=provider,
        spec={"name": name},
        status="active",
        now=NOW,
        tainted=tainted,
    )


def run_entry(name: str, fleet: str) -> ResourceState:
    return ResourceState.create(
        f"task.{name}",
        provider="local" if fleet == "local" else "ssh",
        spec={"name": name},
        status="running",
        now=NOW,
        attributes={"fleet": fleet, "jobs": []},
    )


def state_of(*entries: ResourceState) -> State:
    state = State.empty()
    for entry in entries:
        state = state.with_resource(entry)
    return state


def test_top_shows_this_machine_only_when_runs_use_it_or_there_is_no_ssh_fleet() -> None:
    assert top_fleets(State.empty()) == ["local"]
    assert top_fleets(state_of(run_entry("hello", "local"))) == ["local"]
    ssh = fleet_entry("onprem")
    assert top_fleets(state_of(ssh, run_entry("train", "onprem"))) == ["onprem"]
    assert top_fleets(state_of(ssh, run_entry("hello", "local"))) == ["local", "onprem"]
    broken = fleet_entry("half", tainted=True)
    cloud = fleet_entry("burst", provider="aws")  # its booted machines are hosts too
    assert top_fleets(state_of(ssh, broken, cloud)) == ["onprem", "burst"]


def test_table_cells_show_gpus_used_of_total_with_names_and_tasks_with_run_names() -> None:
    allocated = render([Family("dstack_agent_gpu_allocated", "gauge", "g").add(1, gpu=0, job="j")])
    before = reading(cpu_text(user=0, idle=0) + allocated, [])
    after = reading(cpu_text(user=25, idle=75) + allocated, [job("j", "train", "running", [0])])
    view = TopView(
        taken_at=0.0,
        hosts=(
            host_row("onprem", "10.0.0.2", ["NVIDIA A100"], before, after),
            error_row("onprem", "10.0.0.3", ["NVIDIA A100", "NVIDIA A100"], "refused"),
            error_row("other", "", (), "fleet 'other' is not in state"),
        ),
    )
    rows: list[Any] = table_rows(view)
    assert len(HEADERS) == len(rows[0])
    node, fleet, gpus, mem, cpu, tasks = rows[0]
    assert (node, fleet, gpus, cpu, tasks) == (
        "10.0.0.2",
        "onprem",
        "1/1 NVIDIA A100",
        "25%",
        "1 (train)",
    )
    assert mem == "-"  # this agent reported no memory figures
    assert rows[1] == ("10.0.0.3", "onprem", "?/2 NVIDIA A100", "-", "-", "-")
    assert rows[2] == ("-", "other", "-", "-", "-", "-")
    assert error_lines(view) == [
        "10.0.0.3: refused",
        "fleet.other: fleet 'other' is not in state",
    ]
    assert view.hosts[1].agent == "error" and view.hosts[0].agent == "ok"
