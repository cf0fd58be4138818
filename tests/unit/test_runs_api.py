"""The runs API behind `ps`, `logs`, `stop` and `apply --attach`, from state files alone.

Runs here either have no jobs recorded or sit on a fleet without a provider yet, so no agent
is needed; streaming, stopping and logs against a real agent are end-to-end tests.
"""

from __future__ import annotations

import asyncio
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dstack_plan.cli.app import app
from dstack_plan.clock import FakeClock
from dstack_plan.config.loader import load_project
from dstack_plan.errors import DstackPlanError, ProviderError
from dstack_plan.inspect.logs import finished_before, parse_since, select_job
from dstack_plan.inspect.runs import JobView, find_run, list_runs
from dstack_plan.inspect.stop import stop_run, stop_timeout
from dstack_plan.inspect.stream import LinePrefixer, stream_runs
from dstack_plan.project import Project
from dstack_plan.state import LocalBackend, ResourceState, State
from dstack_plan.state.lease import LeaderLease
from dstack_plan.web.wording import format_age, job_gpus, job_status_text

NOW = datetime(2025, 1, 2, 12, 0, tzinfo=timezone.utc)

CONFIG = """\
type: task
name: train
stop_duration: 90s
resources:
  gpu: A100:80GB:2
commands: [python train.py]
---
type: service
name: train
port: 8000
commands: [serve]
---
type: dev-environment
name: ide
ide: vscode
---
type: fleet
name: pool
ssh_config:
  user: root
  hosts: [10.0.0.1]
"""


@pytest.fixture
def specs(tmp_path: Path) -> dict[str, dict[str, Any]]:
    source = tmp_path / "src"
    source.mkdir()
    (source / "all.dstack.yml").write_text(CONFIG)
    return {r.address: r.normalized for r in load_project(source)}


def entry(
    address: str,
    spec: dict[str, Any],
    *,
    status: str,
    jobs: list[dict[str, Any]] | None = None,
    fleet: str = "local",
    created: datetime = NOW,
    updated: datetime | None = None,
) -> ResourceState:
    resource = ResourceState.create(
        address,
        provider="local",
        spec=spec,
        status=status,
        now=created,
        attributes={
            "fleet": fleet,
            "generation": 1,
            "deployment": "abc123",
            "price_per_hour": 1.5,
            "jobs": jobs or [],
        },
    )
    if updated is not None:
        resource = resource.model_copy(update={"updated_at": updated})
    return resource


def job(job_id: str, replica: int = 0, node: int = 0) -> dict[str, Any]:
    return {
        "id": job_id,
        "host": "10.0.0.1",
        "replica": replica,
        "node": node,
        "status": "running",
        "runtime": "docker",
    }


def write_state(tmp_path: Path, *resources: ResourceState) -> Project:
    path = tmp_path / ".dstack" / "state.json"
    backend = LocalBackend(path)
    state = State.empty()
    for resource in resources:
        state = state.with_resource(resource)
    backend.write(state, backend.read().version)
    return Project(tmp_path, state_path=path, agent_dir=tmp_path / "agent")


def test_no_runs_in_a_missing_or_run_free_state(tmp_path: Path) -> None:
    project = Project(tmp_path, agent_dir=tmp_path / "agent")
    assert asyncio.run(list_runs(project, all_runs=True)) == []
    fleet_only = entry("fleet.pool", {"name": "pool"}, status="active")
    assert asyncio.run(list_runs(write_state(tmp_path, fleet_only), all_runs=True)) == []
    assert not (tmp_path / "agent").exists()  # nothing asked an agent, nothing started one


def test_find_run_by_name_or_address(tmp_path: Path, specs: dict[str, dict[str, Any]]) -> None:
    state = State.empty()
    for address in ("task.train", "service.train", "dev-environment.ide"):
        state = state.with_resource(entry(address, specs[address], status="running"))
    assert find_run(state, "ide").address == "dev-environment.ide"
    assert find_run(state, "service.train").address == "service.train"
    with pytest.raises(DstackPlanError, match="'train' is ambiguous: it names service.train, "):
        find_run(state, "train")
    with pytest.raises(DstackPlanError) as error:
        find_run(state, "nope")
    assert str(error.value) == (
        "no run 'nope' in state (known runs: dev-environment.ide, service.train, task.train)"
    )
    with pytest.raises(DstackPlanError, match=r"known runs: none"):
        find_run(State.empty(), "task.train")


def test_listing_and_the_recently_finished_window(
    tmp_path: Path, specs: dict[str, dict[str, Any]]
) -> None:
    project = write_state(
        tmp_path,
        entry("task.train", specs["task.train"], status="running", created=NOW),
        entry(
            "service.train",
            specs["service.train"],
            status="done",
            created=NOW - timedelta(hours=3),
            updated=NOW - timedelta(minutes=20),
        ),
        entry(
            "dev-environment.ide",
            specs["dev-environment.ide"],
            status="terminated",
            created=NOW - timedelta(hours=5),
            updated=NOW - timedelta(hours=2),
        ),
    )
    now = NOW.timestamp() + 60
    recent = asyncio.run(list_runs(project, now=now))
    assert [v.address for v in recent] == ["task.train", "service.train"]
    everything = asyncio.run(list_runs(project, all_runs=True, now=now))
    assert [v.address for v in everything] == [
        "task.train",
        "service.train",
        "dev-environment.ide",
    ]
    only = asyncio.run(list_runs(project, all_runs=True, addresses={"task.train"}, now=now))
    assert [v.address for v in only] == ["task.train"]
    train = everything[0]
    assert (train.gpus, train.price_per_hour, train.error) == ("A100:80GB:2", 1.5, None)
    assert everything[1].gpus is None


def test_a_run_whose_agent_cannot_be_asked_keeps_its_last_status(
    tmp_path: Path, specs: dict[str, dict[str, Any]]
) -> None:
    jobs = [job("train-0-0-1-abc123", node=0), job("train-0-1-1-abc123", node=1)]
    project = write_state(
        tmp_path,
        entry("task.train", specs["task.train"], status="running", jobs=jobs, fleet="pool"),
    )
    [view] = asyncio.run(list_runs(project))
    assert view.status == "running"
    assert view.error is not None and "fleet 'pool' is not in state" in view.error
    assert view.model_dump(mode="json") == {
        "address": "task.train",
        "kind": "task",
        "name": "train",
        "status": "running",
        "fleet": "pool",
        "hosts": ["10.0.0.1"],
        "gpus": "A100:80GB:2",
        "price_per_hour": 1.5,
        "created_at": "2025-01-02T12:00:00Z",
        "finished_at": None,
        "error": view.error,
        "failure": None,
        "jobs": [
            {
                "id": f"train-0-{n}-1-abc123",
                "status": "running",
                "exit_code": None,
                "termination_reason": None,
                "termination_message": None,
                "replica": 0,
                "node": n,
                "host": "10.0.0.1",
                "gpus": [],
                "gpu_share": None,
                "gpu_sharing": None,
                "ports": [],
                "started_at": None,
                "finished_at": None,
            }
            for n in (0, 1)
        ],
        "notes": [],
        "url": None,
        "scaling": None,
        "attempts": [],
    }


def test_ps_json_and_table(tmp_path: Path, specs: dict[str, dict[str, Any]]) -> None:
    jobs = [job("train-0-0-1-abc123", node=0), job("train-0-1-1-abc123", node=1)]
    project = write_state(
        tmp_path,
        entry("task.train", specs["task.train"], status="running", jobs=jobs, fleet="pool"),
    )
    runner = CliRunner()
    state = str(project.backend.location)
    result = runner.invoke(app, ["ps", str(tmp_path), "--state", state, "--json"])
    assert result.exit_code == 0, result.output
    [listed] = json.loads(result.stdout)
    assert (listed["address"], len(listed["jobs"])) == ("task.train", 2)

    result = runner.invoke(app, ["ps", str(tmp_path), "--state", state], env={"NO_COLOR": "1"})
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "NAME", "STATUS", "FLEET", "HOSTS", "PORTS", "GPU", "PRICE", "AGE"
    ]  # fmt: skip
    assert lines[1].split()[:6] == [
        "task.train",
        "running*",
        "pool",
        "10.0.0.1",
        "A100:80GB:2",
        "$1.50/h",
    ]
    assert [line.split()[:3] for line in lines[2:4]] == [
        ["replica=0", "job=0", "running"],
        ["replica=0", "job=1", "running"],
    ]
    assert lines[4] == (
        "* task.train: status as of the last apply: fleet: fleet 'pool' is not in state: "
        "apply it first"
    )


def test_ps_on_an_empty_project(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["ps", str(tmp_path)], env={"NO_COLOR": "1"})
    assert (result.exit_code, result.stdout) == (
        0,
        "No runs. (dstack ps -a shows finished ones too.)\n",
    )


def test_stop_needs_the_runs_agent(tmp_path: Path, specs: dict[str, dict[str, Any]]) -> None:
    run = entry("task.train", specs["task.train"], status="running", jobs=[job("j")], fleet="pool")
    project = write_state(tmp_path, run)
    assert stop_timeout(run) == 90.0
    with pytest.raises(ProviderError, match="fleet 'pool' is not in state"):
        asyncio.run(stop_run(project, "train"))
    with pytest.raises(DstackPlanError, match="no run 'nope'"):
        asyncio.run(stop_run(project, "nope"))


def test_stop_refuses_without_confirmation_when_not_interactive(
    tmp_path: Path, specs: dict[str, dict[str, Any]]
) -> None:
    project = write_state(tmp_path, entry("task.train", specs["task.train"], status="running"))
    result = CliRunner().invoke(
        app, ["stop", "train", str(tmp_path), "--state", str(project.backend.location)]
    )
    assert isinstance(result.exception, DstackPlanError)
    assert "needs confirmation: pass -y" in str(result.exception)


def test_select_job_and_its_errors(specs: dict[str, dict[str, Any]]) -> None:
    jobs = [job("a", replica=0), job("b", replica=1)]
    run = entry("service.train", specs["service.train"], status="running", jobs=jobs)
    assert select_job(run, replica=1).id == "b"
    with pytest.raises(DstackPlanError) as error:
        select_job(run, replica=0, job=1)
    assert str(error.value) == (
        "service.train has no job replica=0 job=1 (it has: replica=0 job=0, replica=1 job=0)"
    )


def test_parse_since() -> None:
    now = 1_700_000_000.0
    assert parse_since("10m", now) == now - 600
    assert parse_since("90", now) == now - 90
    moment = datetime(2024, 5, 1, 12, tzinfo=timezone.utc).timestamp()
    assert parse_since("2024-05-01T12:00:00Z", now) == moment
    assert parse_since("2024-05-01T14:00:00+02:00", now) == moment
    assert parse_since("2024-05-01T12:00:00", now) == moment  # no offset: UTC
    with pytest.raises(DstackPlanError, match="--since 'yesterday'"):
        parse_since("yesterday", now)


def test_since_skips_only_jobs_that_ended_before_it() -> None:
    from dstack_plan.agent.api_models import JobInfo

    def info(finished: float | None) -> JobInfo:
        return JobInfo(
            id="j",
            run_name="r",
            runtime="process",
            status="done" if finished else "running",
            submitted_at=100.0,
            finished_at=finished,
        )

    assert finished_before(info(150.0), since=200.0)
    assert not finished_before(info(250.0), since=200.0)
    assert not finished_before(info(None), since=200.0)
    assert not finished_before(info(150.0), since=None)


def test_line_prefixer_keeps_lines_whole_across_chunks() -> None:
    lines = LinePrefixer(b"job-1 | ")
    assert lines.feed(b"hel") == b""
    assert lines.feed(b"lo\nwor") == b"job-1 | hello\n"
    assert lines.feed(b"ld\n\nlast") == b"job-1 | world\njob-1 | \n"
    assert lines.flush() == b"job-1 | last\n"
    assert lines.flush() == b""


def test_streaming_runs_without_jobs_ends_at_once(
    tmp_path: Path, specs: dict[str, dict[str, Any]]
) -> None:
    run = entry("task.train", specs["task.train"], status="done")
    project = write_state(tmp_path, run)
    out = io.BytesIO()
    result = asyncio.run(stream_runs(project, [run], out))
    assert (out.getvalue(), result.finished, result.detached) == (b"", {}, False)


def test_job_wording_and_ages() -> None:
    def view(status: str, exit_code: int | None = None) -> JobView:
        return JobView(id="j", status=status, exit_code=exit_code, replica=0, node=0, host="h")

    assert job_status_text(view("failed", 3)) == "exited (3)"
    assert job_status_text(view("terminated", 143)) == "stopped"
    assert job_status_text(view("running")) == "running"
    # a job row names the GPUs it holds: `0` under GPU would read as "no GPUs"
    held = view("running").model_copy(update={"gpus": [0]})
    assert [job_gpus(view("running")), job_gpus(held)] == ["-", "GPU 0"]
    assert job_gpus(held.model_copy(update={"gpus": [2, 3]})) == "GPUs 2,3"
    assert [format_age(s) for s in (0.2, 45, 61, 7200, 3 * 86400)] == [
        "now",
        "45s",
        "1m",
        "2h",
        "3d",
    ]


def test_a_tainted_run_is_shown_as_recorded(
    tmp_path: Path, specs: dict[str, dict[str, Any]]
) -> None:
    tainted = ResourceState.create(
        "task.train",
        provider="local",
        spec=specs["task.train"],
        status="creating",
        now=NOW,
        attributes={"fleet": "local", "jobs": [job("train-0-0-1-abc123")]},
        tainted=True,
    )
    project = write_state(tmp_path, tainted)
    [view] = asyncio.run(list_runs(project, now=NOW.timestamp()))
    assert (view.status, view.jobs[0].status) == ("creating", "running")
    assert view.error == "tainted: its creation did not complete; the next apply replaces it"
    assert not (tmp_path / "agent").exists()  # not refreshed: no agent was started


def test_a_retrying_run_listed_alone_knows_a_watch_leads(tmp_path: Path) -> None:
    """`ps --run flaky` lists no service, and still reads the lease: a run waiting for its
    retry says only when, while a watch leads, and that none runs otherwise."""
    spec = {"name": "flaky", "commands": ["exit 3"], "retry": {"on_events": ["error"]}}
    waiting = entry("task.flaky", spec, status="pending")
    waiting = waiting.model_copy(
        update={"attributes": {**waiting.attributes, "retry": {"next_attempt_at": 1e10}}}
    )
    project = write_state(tmp_path, waiting)
    now = NOW.timestamp() + 60

    def note() -> list[str]:
        [view] = asyncio.run(list_runs(project, addresses={"task.flaky"}, now=now))
        return view.notes

    assert note()[0].endswith(": no dstack watch runs to retry it (`dstack watch`)")
    lease = LeaderLease(project.backend, "host:1:ab", clock=FakeClock(now))
    assert lease.acquire_or_renew()
    assert note()[0].startswith("retrying at ") and "no dstack watch" not in note()[0]
