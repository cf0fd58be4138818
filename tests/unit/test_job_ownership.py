"""Which agent jobs belong to a state: keyed by its lineage, and removed only when the state
names them exactly (its ids, or its key and generation), across projects and old states."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.apply.deployment import Deployment, deployment_key
from dstack_plan.errors import StateError
from dstack_plan.runs.ownership import jobs_to_remove as _jobs_to_remove
from dstack_plan.state import LocalBackend, ResourceState, commit

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
NOW_MS = int(NOW.timestamp() * 1000)
MINE, THEIRS = deployment_key("lineage-b"), deployment_key("lineage-a")
LEGACY = "88138a"  # sha1(".dstack/state.json")[:6]: the key every project shared before


def job(
    key: str, generation: int, address: str | None = "task.train", labelled: bool = True
) -> JobInfo:
    labels: dict[str, Any] = {"deployment": key, "generation": str(generation)}
    if address is not None:
        labels["address"] = address
    return JobInfo(
        id=f"train-0-0-{generation}-{key}",
        run_name="train",
        runtime="process",
        status="running",
        submitted_at=1.0,
        spec={"labels": labels} if labelled else {},
    )


def entry(attributes: dict[str, Any], tainted: bool = False) -> ResourceState:
    return ResourceState.create(
        "task.train",
        provider="local",
        spec={"type": "task"},
        status="creating" if tainted else "running",
        now=NOW,
        attributes=attributes,
        tainted=tainted,
    )


def test_keys_come_from_the_lineage_and_differ_from_the_old_path_keys() -> None:
    assert MINE != THEIRS and len(MINE) == 8 and int(MINE, 16) >= 0
    assert deployment_key("lineage-b") == MINE


def test_a_killed_create_never_takes_another_projects_job_of_the_same_name() -> None:
    intent = entry({}, tainted=True)
    own = job(MINE, NOW_MS + 5)
    listed = [job(THEIRS, NOW_MS - 60_000), job(THEIRS, NOW_MS + 3), own, job(LEGACY, NOW_MS + 7)]
    assert _jobs_to_remove(intent, listed, MINE, None) == {own.id}


def test_an_old_state_finds_its_jobs_under_the_key_it_recorded() -> None:
    generation = NOW_MS - 1000
    old = entry({"deployment": LEGACY, "generation": generation, "jobs": []})
    scaled_before = job(LEGACY, generation, labelled=False)  # its key and generation in its id
    scaled_after = job(MINE, generation)  # a replica added after the upgrade
    other_project = job(LEGACY, generation - 5)  # the shared old key, another generation
    listed = [scaled_before, scaled_after, other_project]
    assert _jobs_to_remove(old, listed, MINE, None) == {scaled_before.id, scaled_after.id}


def test_a_run_of_another_kind_with_the_same_name_is_spared() -> None:
    intent = entry({}, tainted=True)
    service = job(MINE, NOW_MS + 5, address="service.train")
    assert _jobs_to_remove(intent, [service], MINE, None) == set()


def test_recorded_ids_always_go() -> None:
    old = entry({"deployment": LEGACY, "generation": 1, "jobs": [{"id": "train-by-hand"}]})
    assert _jobs_to_remove(old, [], MINE, None) == {"train-by-hand"}


def test_the_key_is_the_stored_lineages_once_the_state_exists(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    deployment = Deployment(backend)
    before = deployment.key  # no state yet: a lineage nobody keeps
    stored = commit(backend, lambda state: state.with_resource(entry({}))).state
    assert str(deployment) == deployment_key(stored.lineage) != before
    backend.path.unlink()  # remembered once read: one state, one key, for good
    assert deployment.key == deployment_key(stored.lineage)


def test_a_snapshot_already_read_gives_the_key_without_reading_again(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    deployment = Deployment(backend)
    deployment.remember(backend.read())  # no state yet: nothing to remember
    stored = commit(backend, lambda state: state.with_resource(entry({}))).state
    snapshot = backend.read()
    backend.path.unlink()  # the key must come from the snapshot, not from the file
    deployment.remember(snapshot)
    assert deployment.key == deployment_key(stored.lineage)


def test_the_lineage_of_any_stored_state_is_read(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    stored = commit(backend, lambda state: state.with_resource(entry({}))).state
    compact = json.dumps(json.loads(backend.path.read_text()), separators=(",", ":"))
    backend.path.write_text(compact)
    assert backend.read_lineage() == stored.lineage
    backend.path.write_text(compact[:40])
    with pytest.raises(StateError, match="not valid JSON"):
        backend.read_lineage()
