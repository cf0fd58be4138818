"""The local backend keeps its last 20 versions as hard links beside the state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import StateError
from dstack_plan.state.backend import ABSENT
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.local_history import KEEP_VERSIONS
from dstack_plan.state.model import ResourceState, State, timestamp

NOW = timestamp(FakeClock())


def entry(address: str, status: str = "done") -> ResourceState:
    return ResourceState.create(address, provider="local", spec={}, status=status, now=NOW)


def write_versions(backend: LocalBackend, count: int) -> State:
    snapshot = backend.read()
    for i in range(count):
        snapshot = backend.write(
            snapshot.state.with_resource(entry(f"task.t{i}")), snapshot.version
        )
    return snapshot.state


def test_each_write_is_kept_as_a_link_to_the_written_inode(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    write_versions(backend, 3)
    kept = tmp_path / "state.json.history"
    assert sorted(p.name for p in kept.iterdir()) == ["1.json", "2.json", "3.json"]
    assert os.stat(kept / "3.json").st_ino == os.stat(tmp_path / "state.json").st_ino
    assert (kept / "3.json").stat().st_mode & 0o777 == 0o600
    assert backend.read_version("1").addresses == ["task.t0"]
    assert backend.read_version("2").addresses == ["task.t0", "task.t1"]
    assert (tmp_path / "state.json.backup").exists()  # the backup is kept as before


def test_history_lists_newest_first_with_the_current_marked(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    state = write_versions(backend, 3)
    versions = backend.history()
    assert [(v.id, v.serial, v.current) for v in versions] == [
        ("3", 3, True),
        ("2", 2, False),
        ("1", 1, False),
    ]
    assert {v.lineage for v in versions} == {state.lineage}
    assert all(v.written_at is not None for v in versions)


def test_history_is_pruned_to_the_last_twenty(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    write_versions(backend, KEEP_VERSIONS + 5)
    serials = [v.serial for v in backend.history()]
    assert serials == list(range(KEEP_VERSIONS + 5, 5, -1))
    with pytest.raises(StateError, match="version 3 is not kept"):
        backend.read_version("3")
    with pytest.raises(StateError, match="a version is a serial"):
        backend.read_version("../state")


def test_a_no_op_write_keeps_no_version(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    state = write_versions(backend, 1)
    backend.write(state, str(state.serial))
    assert [v.serial for v in backend.history()] == [1]


def test_a_state_written_before_history_is_listed_as_current(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    state = write_versions(backend, 2)
    for kept in (tmp_path / "state.json.history").iterdir():
        kept.unlink()
    assert [(v.serial, v.current) for v in backend.history()] == [(2, True)]
    assert backend.read_version("2") == state
    assert LocalBackend(tmp_path / "none.json").history() == []
    assert backend.read().version != ABSENT


def test_an_import_keeps_its_serial_and_never_lowers_the_stored_one(tmp_path: Path) -> None:
    from dstack_plan.state.importing import importing

    backend = LocalBackend(tmp_path / "state.json")
    migrated = State.empty().with_resource(entry("task.a")).model_copy(update={"serial": 41})
    with importing():
        assert backend.write(migrated, ABSENT).state.serial == 41
    assert [v.serial for v in backend.history()] == [41]
    older = migrated.with_resource(entry("task.b")).model_copy(update={"serial": 3})
    with importing():
        assert backend.write(older, "41").state.serial == 42
    other = State.empty().with_resource(entry("task.c"))
    with pytest.raises(StateError, match="unrelated state"), importing():
        backend.write(other, "42")
    with importing(other_lineage=True):
        assert backend.write(other, "42").state.lineage == other.lineage
    with pytest.raises(StateError, match="unrelated state"):  # outside: the normal rules
        backend.write(migrated, "43")
