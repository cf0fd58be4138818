"""`dstack agent status|stop`: the local agent a run on the local fleet started, seen and
stopped through the CLI; the note of the command that started it names `dstack agent stop`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import wait_for_status

TASK = """\
type: task
name: hello
commands:
  - echo hi
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""


def _alive(pid: int) -> bool:
    """The process runs (a zombie no longer does: the detached agent's parent, the CLI, is
    gone, and a container's pid 1 may never reap it)."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_agent_status_and_stop_of_the_agent_a_local_run_started(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    before = dstack("agent", "status")
    assert before.returncode == 3
    assert f"The local agent is not running (data dir {agent_dir})." in before.stdout

    (tmp_path / "project" / "hello.dstack.yml").write_text(TASK)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # the note of the command that started it says how to stop it, spelled as the CLI
    assert "Started the local agent (pid " in applied.stderr
    assert "Stop it with: dstack agent stop" in applied.stderr
    assert "python -m dstack_plan.agent" not in applied.stderr
    wait_for_status(dstack, "task.hello", {"done"})

    status = dstack("agent", "status", "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["running"] is True
    assert info["data_dir"] == str(agent_dir)
    pid = info["pid"]
    assert isinstance(pid, int) and _alive(pid)
    assert isinstance(info["port"], int) and info["version"]
    assert f"Started the local agent (pid {pid}," in applied.stderr

    # bare `dstack agent` is `dstack agent status`
    bare = dstack("agent")
    assert bare.returncode == 0, bare.stderr
    assert "The local agent is running." in bare.stdout and f"pid:       {pid}" in bare.stdout
    assert json.loads(dstack("agent", "--json").stdout) == info

    # --pid of another process leaves it running
    other = dstack("agent", "stop", "--pid", str(pid + 1_000_000))
    assert other.returncode == 0, other.stderr
    assert "left running" in other.stdout and _alive(pid)

    stopped = dstack("agent", "stop", "--timeout", "30")
    assert stopped.returncode == 0, stopped.stderr
    assert f"Stopped the local agent (pid {pid}, data dir {agent_dir})." in stopped.stdout
    # it stopped serving (its lock is free) before `stop` returned; its exit follows at once
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"the agent (pid {pid}) is still alive"
        time.sleep(0.05)

    after = dstack("agent", "status")
    assert after.returncode == 3
    assert f"The local agent is not running (data dir {agent_dir})." in after.stdout
    after_json = dstack("agent", "status", "--json")
    assert after_json.returncode == 3
    assert json.loads(after_json.stdout) == {"running": False, "data_dir": str(agent_dir)}

    again = dstack("agent", "stop")
    assert again.returncode == 0 and "is not running" in again.stdout
