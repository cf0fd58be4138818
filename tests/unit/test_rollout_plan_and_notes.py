"""Rolling updates in the plan (text and JSON), job spec hashes, and the NOTE column of `ps`
made from state attributes (pure)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from dstack_plan.inspect.notes import run_notes
from dstack_plan.plan.json_plan import plan_to_json
from dstack_plan.plan.lines import Line
from dstack_plan.plan.model import Action
from dstack_plan.plan.render import render_plan
from dstack_plan.runs.records import served_now
from dstack_plan.runs.rollout import in_progress, job_spec_hash, outdated, progress_note
from dstack_plan.state.model import ResourceState
from tests.unit.test_planner import NOW, desired_items, plan, state_of

WEB = (
    "type: service\nname: web\nimage: busybox\nport: 80\nreplicas: 2\n"
    "commands: [httpd]\nenv: {V: '1'}\n"
)


def _text(lines: list[Line]) -> str:
    return "\n".join(
        line if isinstance(line, str) else "".join(p if isinstance(p, str) else p[0] for p in line)
        for line in lines
    )


def test_a_change_of_what_replicas_run_is_a_rolling_update(tmp_path: Path) -> None:
    state = state_of(desired_items(tmp_path / "a", WEB))
    changed = WEB.replace("V: '1'", "V: '2'").replace("replicas: 2", "replicas: 3")
    p = plan(desired_items(tmp_path / "b", changed), state)
    (change,) = [c for c in p.changes if c.action is not Action.NOOP]
    assert change.action is Action.UPDATE
    assert change.action_reason == "update_rolling"
    assert change.reason == "rolling update, one replica at a time: env.V, replicas"
    assert "will be updated in-place, rolling: one replica at a time" in _text(render_plan(p))
    (as_json,) = plan_to_json(p)["resource_changes"]
    assert as_json["action_reason"] == "update_rolling"
    assert as_json["change"]["actions"] == ["update"]


def test_scaling_alone_is_not_rolling_and_exposure_replaces(tmp_path: Path) -> None:
    state = state_of(desired_items(tmp_path / "a", WEB))
    p = plan(desired_items(tmp_path / "b", WEB.replace("replicas: 2", "replicas: 3")), state)
    (change,) = [c for c in p.changes if c.action is not Action.NOOP]
    assert change.action is Action.UPDATE and change.action_reason is None
    p = plan(desired_items(tmp_path / "c", WEB + "https: false\n"), state)
    (change,) = [c for c in p.changes if c.action is not Action.NOOP]
    assert change.action is Action.DELETE_THEN_CREATE


def _entry(spec_text: str, tmp_path: Path, **attributes: object) -> ResourceState:
    (item,) = desired_items(tmp_path, spec_text)
    return ResourceState.create(
        item.address, provider="local", spec=item.spec, status="running", now=NOW,
        attributes=attributes,
    )  # fmt: skip


def test_job_spec_hash_ignores_replicas_and_outdated_jobs_are_found(tmp_path: Path) -> None:
    old = _entry(WEB, tmp_path / "a")
    more = _entry(WEB.replace("replicas: 2", "replicas: 4"), tmp_path / "b")
    assert job_spec_hash(old.spec) == job_spec_hash(more.spec)
    new = _entry(WEB.replace("V: '1'", "V: '2'"), tmp_path / "c")
    assert job_spec_hash(old.spec) != job_spec_hash(new.spec)
    jobs = [
        {"id": "web-0", "replica": 0, "status": "running", "spec_hash": job_spec_hash(new.spec)},
        {"id": "web-1", "replica": 1, "status": "running", "spec_hash": job_spec_hash(old.spec)},
        {"id": "web-0-old", "replica": 0, "status": "terminated", "spec_hash": "x"},
    ]
    rolling = new.updated(now=NOW, attributes={"jobs": jobs})
    assert [j.id for j in outdated(rolling)] == ["web-1"]
    assert in_progress(rolling)
    assert progress_note(rolling) == "rolling out: 1/2 replicas on the new spec"
    # jobs without a hash run the entry's spec (as created)
    created = new.updated(now=NOW, attributes={"jobs": [{"id": "a", "status": "running"}]})
    assert not in_progress(created) and progress_note(created) is None


def test_ps_notes_come_from_state_attributes(tmp_path: Path) -> None:
    at = datetime(2026, 5, 1, 12, 3, 15).timestamp()  # local time, as ps shows it
    task = "type: task\nname: tt\ncommands: ['true']\n"
    retrying = _entry(task, tmp_path / "a", retry={"next_attempt_at": at, "attempts": 1})
    assert run_notes(retrying) == ["retrying at 12:03:15"]
    assert run_notes(retrying, watching=False) == [
        "retrying at 12:03:15: no dstack watch runs to retry it (`dstack watch`)"
    ]
    queued = _entry(task, tmp_path / "b", queued={"since": at, "why": "no host has 2 GPUs"})
    assert run_notes(queued) == ["waiting for capacity: no host has 2 GPUs"]
    cron = _entry(task, tmp_path / "c", schedule={"next_run_at": at, "last_run_at": None})
    assert run_notes(cron) == ["next run 12:03"]
    scaled = _entry(
        "type: service\nname: ss\nport: 80\nreplicas: 1..4\ncommands: [x]\n"
        "scaling: {metric: rps, target: 10}\n",
        tmp_path / "d",
    )
    assert run_notes(scaled) == [
        "scaling by rps needs a serving `dstack watch`: keeps 1 replica (replicas 1..4)"
    ]
    assert run_notes(_entry(WEB, tmp_path / "e")) == []
    served = _entry(WEB, tmp_path / "f", service_url="http://127.0.0.1:8080/proxy/services/web/")
    assert run_notes(served) == ["serving http://127.0.0.1:8080/proxy/services/web/"]
    assert run_notes(served, served=False, watching=False) == [
        "not served: no dstack watch runs (http://127.0.0.1:8080/proxy/services/web/); "
        "`dstack watch` serves it on 127.0.0.1:3000"
    ]
    assert run_notes(served, served=False) == [
        "not served by the watch that leads (it runs with --no-serve)"
    ]
    assert run_notes(_entry(WEB, tmp_path / "h"), watching=False) == [
        "not served: no dstack watch runs; `dstack watch` serves it on 127.0.0.1:3000"
    ]
    # the watch that recorded the URL serves it only while it is the one that leads
    mine = _entry(WEB, tmp_path / "g", service_url="http://x/", served_by="host:1:ab")
    assert served_now(mine, "host:1:ab") and not served_now(mine, "host:2:cd")
    assert not served_now(mine, None)
    assert served_now(served, "host:2:cd")  # an older watch recorded no holder: any leader


def test_ps_keeps_each_job_on_one_line_in_a_narrow_terminal(tmp_path: Path) -> None:
    """A folded `replica=0 job=1` read as the jobs listed twice; retrying shows a NOTE."""
    from typer.testing import CliRunner

    from dstack_plan.cli.app import app
    from tests.unit.test_runs_api import entry, job, write_state

    (item,) = desired_items(tmp_path / "src", "type: task\nname: train\nnodes: 2\ncommands: [x]\n")
    jobs = [job("train-0-0-1-abc123", node=0), job("train-0-1-1-abc123", node=1)]
    run = entry("task.train", item.spec, status="running", jobs=jobs, fleet="pool")
    at = datetime(2026, 5, 1, 7, 8, 9).timestamp()
    run = run.updated(now=NOW, attributes={**run.attributes, "retry": {"next_attempt_at": at}})
    project = write_state(tmp_path, run)
    state = str(project.backend.location)
    env = {"NO_COLOR": "1", "COLUMNS": "80"}
    result = CliRunner().invoke(app, ["ps", str(tmp_path), "--state", state], env=env)
    lines = result.stdout.splitlines()
    assert lines[0].split()[-1] == "NOTE"
    assert "retrying" in lines[1]
    assert [line.split()[:2] for line in lines if "replica=" in line] == [
        ["replica=0", "job=0"],
        ["replica=0", "job=1"],
    ]


def test_a_failed_run_with_a_retry_no_watch_judged_says_watch_applies_it(tmp_path: Path) -> None:
    """Failed before any watch ran: `ps` says its retry waits for one, not just `failed`."""
    flaky = "type: task\nname: fl\ncommands: ['false']\nretry: {on_events: [error]}\n"
    unseen = _entry(flaky, tmp_path / "a")
    assert run_notes(unseen, watching=False, status="failed") == [
        "no dstack watch runs to apply its retry (`dstack watch`)"
    ]
    assert run_notes(unseen, watching=True, status="failed") == []  # the watch judges it
    assert run_notes(unseen, watching=False, status="running") == []
    # a watch judged it and gave up (its record keeps the failure): nothing more to wait for
    judged = {"last_failure_at": NOW.timestamp(), "attempts": 2}
    given_up = _entry(flaky, tmp_path / "b", retry=judged)
    assert run_notes(given_up, watching=False, status="failed") == []
    plain = _entry("type: task\nname: pl\ncommands: ['false']\n", tmp_path / "c")
    assert run_notes(plain, watching=False, status="failed") == []
