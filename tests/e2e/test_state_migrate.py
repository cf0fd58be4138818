"""`dstack state migrate`: local -> S3 -> local keeps lineage, serial and content, switches
the project each time (plan stays a no-op), and refuses targets it must not replace."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dstack_plan.state.local import LocalBackend
from dstack_plan.state.model import State
from dstack_plan.state.s3 import S3Backend
from dstack_plan.state.s3_location import S3Location
from tests.e2e.conftest import Dstack

TASK = """\
type: task
name: job
commands: ["echo migrated"]
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def no_changes(dstack: Dstack) -> None:
    planned = dstack("plan", "--detailed-exitcode")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "No changes." in planned.stdout


def same(a: State, b: State) -> bool:
    return (a.lineage, a.serial) == (b.lineage, b.serial) and a.same_content(b)


def test_local_to_s3_to_local_round_trip(
    dstack: Dstack, tmp_path: Path, s3_bucket, cli_env: dict[str, str]
) -> None:
    cli_env.update(s3_bucket.env)
    project = tmp_path / "project"
    (project / "job.dstack.yml").write_text(TASK)
    ok(dstack("apply", "-y"))
    local = LocalBackend(project / ".dstack" / "state.json")
    original = local.read().state

    url = s3_bucket.url("team/state.json")
    init = dstack("init", "--backend", "s3", "--bucket", s3_bucket.name, "--key", "k.json")
    assert init.returncode == 1 and "state migrate" in init.stderr  # would strand task.job

    moved = ok(dstack("state", "migrate", "--to", url))
    assert f"Copied serial {original.serial}" in moved.stdout
    config = (project / ".dstack" / "backend.yml").read_text()
    assert "backend: s3" in config and f"bucket: {s3_bucket.name}" in config
    assert "secret" not in config.lower() and "testing" not in config
    remote = S3Backend(S3Location.from_url(url))
    assert same(remote.read().state, original)
    assert "task.job" in ok(dstack("state", "list")).stdout  # now read from S3
    no_changes(dstack)
    assert same(local.read().state, original)  # the source is left as it was

    ok(dstack("state", "migrate", "--to", "copies/state.json"))
    back = LocalBackend(project / "copies" / "state.json")
    assert same(back.read().state, original)
    assert "path: copies/state.json" in (project / ".dstack" / "backend.yml").read_text()
    no_changes(dstack)
    ok(dstack("destroy", "-y"))
    assert back.read().state.resources == {}
    assert remote.read().state.serial == original.serial  # no longer used


def test_migrate_refuses_a_target_with_other_history(
    dstack: Dstack, tmp_path: Path, s3_bucket, cli_env: dict[str, str]
) -> None:
    cli_env.update(s3_bucket.env)
    project = tmp_path / "project"
    refused = dstack("state", "migrate", "--state", "missing.json", "--to", s3_bucket.url())
    assert refused.returncode == 1 and "no state at missing.json" in refused.stderr
    (project / "job.dstack.yml").write_text(TASK)
    ok(dstack("apply", "-y"))
    other = S3Backend(S3Location.from_url(s3_bucket.url()))
    theirs = State.empty()
    theirs_written = other.write(
        theirs.with_resource(
            LocalBackend(project / ".dstack" / "state.json").read().state.resources["task.job"]
        ),
        "absent",
    )
    done = dstack("state", "migrate", "--to", s3_bucket.url())
    assert done.returncode == 1 and "another lineage" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert other.read().state == theirs_written.state
    assert not (project / ".dstack" / "backend.yml").exists()
    ok(dstack("destroy", "-y"))
