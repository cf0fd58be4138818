"""Planning a large project: the state is read while other cores parse the configuration."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from dstack_plan.config import forkmap, loader
from dstack_plan.errors import ConfigError, StateError
from dstack_plan.plan.model import Plan
from dstack_plan.project import Project

VOLUME = "type: volume\nname: data-{i}\nbackend: aws\nregion: us-east-1\nsize: {i}GB\n"


def write_project(root: Path, files: int = 9) -> None:
    for f in range(files):
        docs = [VOLUME.format(i=f * 10 + j + 1) for j in range(4)]
        (root / f"v{f}.dstack.yml").write_text("---\n".join(docs))


def plan_of(root: Path) -> Plan:
    project = Project(root, state_path=root / "state.json", agent_dir=root / "agent")
    project.unsupported = lambda items: {}  # type: ignore[method-assign]  # no provider has volumes yet
    return asyncio.run(project.plan())[0]


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load every project on three processes, however small, on any machine."""
    monkeypatch.setattr(loader, "PARALLEL_LOAD_BYTES", 0)
    monkeypatch.setattr(forkmap, "available_cores", lambda: 3)


def test_the_plan_is_the_one_a_single_core_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_project(tmp_path)
    serial = plan_of(tmp_path)
    monkeypatch.setattr(loader, "PARALLEL_LOAD_BYTES", 0)
    monkeypatch.setattr(forkmap, "available_cores", lambda: 3)
    (tmp_path / "state.json").write_text("")  # exists: this process reads it meanwhile
    with pytest.raises(StateError, match="state file is empty"):
        plan_of(tmp_path)
    (tmp_path / "state.json").unlink()
    assert plan_of(tmp_path) == serial
    assert len(serial.changes) == 36


def test_a_broken_state_stops_the_parsing_children(
    tmp_path: Path, parallel: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = os.getpid()
    load_file = loader._load_file

    def slow_in_children(file: tuple[str, str], normalize: bool = False) -> object:
        if os.getpid() != parent:
            time.sleep(30)  # still parsing when the state read fails
        return load_file(file, normalize)

    monkeypatch.setattr(loader, "_load_file", slow_in_children)
    write_project(tmp_path, files=30)
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(StateError, match="not valid JSON"):
        plan_of(tmp_path)
    assert multiprocessing.active_children() == []


def test_config_errors_from_every_slice_are_reported(tmp_path: Path, parallel: None) -> None:
    write_project(tmp_path)
    (tmp_path / "v0.dstack.yml").write_text("type: volume\nname: x\n")
    (tmp_path / "v8.dstack.yml").write_text("type: nope\n")
    with pytest.raises(ConfigError) as info:
        plan_of(tmp_path)
    files = [issue.file for issue in info.value.issues]
    assert files[0] == "v0.dstack.yml" and files[-1] == "v8.dstack.yml"
