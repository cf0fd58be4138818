"""The plan of a run that waits for room says when it may start: by the max_duration of the
job that holds the GPU (and of the runs queued ahead of it), or `unknown` when that job has
none. A real local agent seeing one fake GPU."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_shared_gpu import one_gpu  # noqa: F401 - fixture

RETRY = "retry: {on_events: [no-capacity], duration: 1h}\n"


def task(name: str, extra: str = "") -> str:
    return (
        f"type: task\nname: {name}\nstop_duration: 1s\ncommands: ['exec sleep 300']\n{extra}"
        "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: 1}\n"
    )


def placement(dstack: Dstack, address: str) -> dict:
    out = dstack("plan", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    [change] = [c for c in json.loads(out.stdout)["resource_changes"] if c["address"] == address]
    return change["placement"]


def test_a_waiting_run_s_plan_says_when_it_may_start(
    one_gpu: Dstack,  # noqa: F811
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    (project / "holder.dstack.yml").write_text(task("holder", "max_duration: 2h\n"))
    before = time.time()
    applied = one_gpu("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(one_gpu, "task.holder", {"running"})
    try:
        (project / "first.dstack.yml").write_text(task("first", RETRY))
        (project / "second.dstack.yml").write_text(task("second", RETRY + "max_duration: 1h\n"))
        waiting = placement(one_gpu, "task.first")
        assert waiting["pending"] is True and waiting["placed"] is False
        # the holder's 2 h (and its 1 s stop), counted from its start on the agent
        assert before + 7200 <= waiting["estimated_start"] <= time.time() + 7201
        assert re.search(
            r"estimated start: \S+ \S+ UTC \(in 1h\d+m\d+s\) at the latest", waiting["note"]
        )
        # `second` is queued behind `first` (plans go by address), which has no max_duration
        second = placement(one_gpu, "task.second")
        assert second["estimated_start"] is None
        assert "estimated start: unknown: runs ahead have no max_duration" in second["note"]
        human = one_gpu("plan").stdout
        assert "estimated start: " in human
    finally:
        (project / "first.dstack.yml").unlink(missing_ok=True)
        (project / "second.dstack.yml").unlink(missing_ok=True)
        assert one_gpu("destroy", "-y").returncode == 0
