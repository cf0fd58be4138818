"""Every `dstack state` command through the CLI, on the local backend and on S3 (moto).

States are mostly made with `state push` of a built state (fast); history and locking use
real applies of small tasks on the local fleet.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock, SystemClock
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.lock import LockInfo
from dstack_plan.state.model import ResourceState, State, timestamp
from tests.e2e.conftest import CLI, Dstack

NOW = timestamp(FakeClock())
TASK = """\
type: task
name: {name}
commands: ["echo {word}"]
resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}
"""


@pytest.fixture(params=["local", "s3"])
def backend(
    request: pytest.FixtureRequest, cli_env: dict[str, str], tmp_path: Path
) -> StateBackend:
    """The test's view of the state the CLI uses: the project's local file, or an S3 object
    the CLI reaches through DSTACK_STATE."""
    if request.param == "local":
        return LocalBackend(tmp_path / "project" / ".dstack" / "state.json")
    from dstack_plan.state.s3 import S3Backend
    from dstack_plan.state.s3_location import S3Location

    # versioned, so history holds every write (an unversioned bucket keeps one backup)
    bucket = request.getfixturevalue("moto_server").bucket(versioning=True)
    cli_env.update(bucket.env)
    cli_env["DSTACK_STATE"] = bucket.url()
    return S3Backend(S3Location.from_url(bucket.url()))


def entry(address: str, depends_on: tuple[str, ...] = (), **attributes: object) -> ResourceState:
    return ResourceState.create(
        address,
        provider="local",
        spec={"name": address.split(".")[1], "depends_on": list(depends_on)},
        status="done",
        now=NOW,
        depends_on=depends_on,
        attributes=attributes,
    )


def built(serial: int, lineage: str, *entries: ResourceState) -> State:
    state = State(lineage=lineage, serial=serial)
    for e in entries:
        state = state.with_resource(e)
    return state


def push_file(tmp_path: Path, state: State, name: str = "push.json") -> str:
    path = tmp_path / name
    path.write_text(state.to_json())
    return str(path)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def refused(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def test_push_list_show_pull_and_push_refusals(
    dstack: Dstack, backend: StateBackend, tmp_path: Path
) -> None:
    lineage = str(uuid.uuid4())
    first = built(7, lineage, entry("fleet.pool"), entry("task.train", ("fleet.pool",)))
    assert "Pushed serial 7" in ok(dstack("state", "push", push_file(tmp_path, first))).stdout
    stored = backend.read().state
    assert (stored.lineage, stored.serial) == (lineage, 7)

    listed = json.loads(ok(dstack("state", "list", "--json")).stdout)
    assert [r["address"] for r in listed] == ["fleet.pool", "task.train"]
    shown = json.loads(ok(dstack("state", "show", "task.train", "--json")).stdout)
    assert shown["depends_on"] == ["fleet.pool"]
    refused(dstack("state", "show", "task.nope"), "no resource 'task.nope'", "task.train")
    assert State.model_validate_json(ok(dstack("state", "pull")).stdout) == stored

    older = built(6, lineage, entry("fleet.pool"))
    refused(dstack("state", "push", push_file(tmp_path, older)), "serial 6 over newer", "--force")
    same = built(7, lineage, entry("fleet.pool"))
    refused(dstack("state", "push", push_file(tmp_path, same)), "same serial")
    other = built(9, str(uuid.uuid4()), entry("fleet.pool"))
    refused(dstack("state", "push", push_file(tmp_path, other)), "unrelated state of lineage")
    assert backend.read().state == stored  # nothing written by the refusals
    again = ok(dstack("state", "push", push_file(tmp_path, first)))
    assert "nothing pushed" in again.stdout

    ok(dstack("state", "push", "--force", push_file(tmp_path, older)))
    forced = backend.read().state
    assert forced.addresses == ["fleet.pool"] and forced.serial == 8  # never goes back
    ok(dstack("state", "push", "--force", push_file(tmp_path, other)))
    assert backend.read().state.lineage == other.lineage
    refused(dstack("state", "push", str(tmp_path / "missing.json")), "cannot read")


def test_rm_and_mv_keep_dependencies_consistent(
    dstack: Dstack, backend: StateBackend, tmp_path: Path
) -> None:
    state = built(
        1,
        str(uuid.uuid4()),
        entry("fleet.pool"),
        entry("volume.data"),
        entry("task.prep", ("fleet.pool", "volume.data"), fleet="pool"),
        entry("task.train", ("fleet.pool", "task.prep"), fleet="pool"),
    )
    ok(dstack("state", "push", push_file(tmp_path, state)))

    assert (
        "Moved fleet.pool to fleet.gpus"
        in ok(dstack("state", "mv", "fleet.pool", "fleet.gpus")).stdout
    )
    after = backend.read().state
    assert after.addresses == ["fleet.gpus", "task.prep", "task.train", "volume.data"]
    train = after.resources["task.train"]
    assert train.depends_on == ("fleet.gpus", "task.prep")
    assert train.spec["depends_on"] == ["fleet.gpus", "task.prep"]
    assert train.attributes["fleet"] == "gpus"
    assert after.resources["fleet.gpus"].name == "gpus"
    assert after.resources["fleet.gpus"].spec["name"] == "gpus"
    refused(dstack("state", "mv", "task.prep", "task.train"), "already exists")
    refused(dstack("state", "mv", "task.prep", "fleet.prep"), "keeps its kind")
    refused(dstack("state", "mv", "task.nope", "task.x"), "no resource 'task.nope'")

    ok(dstack("state", "rm", "task.prep", "volume.data"))
    left = backend.read().state
    assert left.addresses == ["fleet.gpus", "task.train"]
    assert left.resources["task.train"].depends_on == ("fleet.gpus",)
    refused(dstack("state", "rm", "task.train", "task.gone"), "task.gone")
    assert backend.read().state.addresses == ["fleet.gpus", "task.train"]  # all or nothing
    backups = backend.history()
    assert backups[0].current and len(backups) >= 2  # every write kept a backup


def test_unlock_only_with_the_right_id(
    dstack: Dstack, backend: StateBackend, tmp_path: Path
) -> None:
    ok(dstack("state", "push", push_file(tmp_path, built(1, str(uuid.uuid4()), entry("task.a")))))
    if isinstance(backend, LocalBackend):
        # a local lock whose process died leaves only its record behind
        info = LockInfo.new(
            operation="apply",
            who="gone@host",
            path=str(backend.path),
            ttl=60,
            clock=SystemClock(),
            pid=None,
        )
        backend.lock_info_path.write_text(info.to_json())
        lock_id = info.id
    else:
        handle = backend.try_lock("apply", "gone@host", 300, SystemClock())
        lock_id = handle.info.id
    refused(dstack("state", "unlock", "not-the-id"), "does not match")
    assert backend.read_lock_info() is not None or isinstance(backend, LocalBackend)
    assert lock_id in ok(dstack("state", "unlock", lock_id)).stdout
    assert backend.read_lock_info() is None
    refused(dstack("state", "unlock", lock_id), "not locked")


def test_history_after_applies_and_show_version(
    dstack: Dstack, backend: StateBackend, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    for word in ("one", "two"):
        (project / "job.dstack.yml").write_text(TASK.format(name="job", word=word))
        ok(dstack("apply", "-y"))
    versions = json.loads(ok(dstack("state", "history", "--json")).stdout)
    serial = backend.read().state.serial
    assert versions[0]["serial"] == serial and versions[0]["current"]
    assert all(v["lineage"] == backend.read().state.lineage for v in versions)
    assert len(versions) >= 2 and versions[1]["serial"] < serial
    table = ok(dstack("state", "history")).stdout
    assert table.splitlines()[0].split() == ["ID", "SERIAL", "WRITTEN"]

    def commands(*version: str) -> list[str]:
        args = ["state", "show", "task.job", "--json", *version]
        return json.loads(ok(dstack(*args)).stdout)["spec"]["commands"]

    assert commands() == ["echo two"]
    assert ["echo one"] in [commands("--version", v["id"]) for v in versions[1:]]
    refused(dstack("state", "show", "task.job", "--version", "99999"))


def test_two_applies_at_once_one_wins_the_other_names_the_holder(
    dstack: Dstack, backend: StateBackend, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "job.dstack.yml").write_text(TASK.format(name="job", word="hi"))
    project.joinpath(".dstack").mkdir(exist_ok=True)
    handle = backend.try_lock("apply", "alice@ci", 300, SystemClock())
    try:
        refused(
            dstack("apply", "-y"), "is locked by another operation", "alice@ci", handle.info.id
        )
    finally:
        handle.release()
    assert not backend.read().exists

    both = [
        subprocess.Popen(
            [*CLI, "apply", "-y"],
            cwd=project,
            env=cli_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in both]
    assert 0 in [code for code, _ in results], results
    for code, err in results:
        assert code == 0 or ("Lock Info" in err and "Who:" in err), err
    assert backend.read().state.addresses == ["task.job"]
    ok(dstack("destroy", "-y"))
