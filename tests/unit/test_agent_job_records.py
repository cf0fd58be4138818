"""Which of a job's records the agent fsyncs, and a start after a host went down.

A process job's records between its submit and its end serve a restart of the agent on a
running host (the page cache has them); only its outcome must outlive the host, where a job
that ended `done` must not read back as failed. These run a real JobManager with the process
runtime in a temporary data dir (no HTTP: the manager is what writes the records).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent import jobs as jobs_module
from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.dockerlib import DockerEngine
from dstack_plan.agent.gpualloc import GpuAllocator
from dstack_plan.agent.jobs import JobManager

NET = 60.0
"""Seconds `info(wait=...)` may hold for a job to end: a safety net (a `true` ends at once)."""


def _manager(root: Path) -> JobManager:
    data = DataDir(root)
    data.ensure()
    return JobManager(data, "a" * 16, DockerEngine(), GpuAllocator(), None, 1 << 20)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """(status the record says, whether it was fsynced) for every job record written."""
    seen: list[tuple[str, bool]] = []
    real = jobs_module.write_json_atomic

    def recording(path: Path, data: Any, mode: int = 0o600, sync: bool = True) -> None:
        seen.append((data["status"], sync))
        real(path, data, mode, sync=sync)

    monkeypatch.setattr(jobs_module, "write_json_atomic", recording)
    yield seen


def test_a_process_jobs_outcome_alone_is_fsynced(
    tmp_path: Path, writes: list[tuple[str, bool]]
) -> None:
    manager = _manager(tmp_path)
    manager.submit({"id": "j1", "run_name": "r", "commands": ["true"]})
    info = manager.info("j1", wait=NET)
    assert info["status"] == "done"
    assert writes[0] == ("submitted", False)
    assert writes[-1] == ("done", True)
    assert [w for w in writes if w[1]] == [("done", True)]  # submitted, running: page cache


def test_a_failed_outcome_is_fsynced_too(tmp_path: Path, writes: list[tuple[str, bool]]) -> None:
    manager = _manager(tmp_path)
    manager.submit({"id": "j2", "run_name": "r", "commands": ["exit 3"]})
    info = manager.info("j2", wait=NET)
    assert (info["status"], info["exit_code"]) == ("failed", 3)
    assert [w for w in writes if w[1]] == [("failed", True)]


def test_a_record_a_host_crash_left_empty_is_ignored_and_the_job_can_run_again(
    tmp_path: Path,
) -> None:
    """What a host that went down right after a submit may leave: the job's directory with an
    empty record (written, never flushed). The next start ignores it; the controller finds
    the job gone and may submit it again under the same id."""
    data = DataDir(tmp_path)
    data.ensure()
    data.job_dir("lost").mkdir(parents=True)
    (data.job_dir("lost") / "job.json").write_text("")
    after = _manager(tmp_path)
    after.recover()
    assert after.list() == []
    after.submit({"id": "lost", "run_name": "r", "commands": ["true"]})
    assert after.info("lost", wait=NET)["status"] == "done"
