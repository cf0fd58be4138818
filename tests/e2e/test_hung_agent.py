"""An agent that runs but does not answer (here: SIGSTOPped) is restarted by the next
`dstack apply`, which succeeds and says so; the container job it ran is re-adopted by the new
agent (still running, same container).

The SSH host is a network namespace sharing this machine's file system and process table
(tests/infra/ssh_hosts.py), so the test reads the agent's pid from its data dir on the host and
signals it from here. No test waits on a duration: each waits for a condition, with a generous
limit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.liveness import read_pid
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.infra.docker_images import ensure_busybox_image
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.docker

PATIENCE = 120.0
"""Seconds any condition gets (the machine may be loaded); never a duration asserted."""


def task(image: str, fleets: str = "") -> str:
    return (
        f"type: task\nname: box\nimage: {image}\ncommands: ['sleep 600']\n"
        f"stop_duration: 1s\n{RESOURCES}{fleets}"
    )


def running(pid: int) -> bool:
    """The process runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {PATIENCE:g}s"
        time.sleep(0.1)


def restarted(output: str, host: str, pid: int) -> bool:
    said = rf"^{re.escape(host)}: agent \(pid {pid}\) did not answer within [\d.]+s; restarted it$"
    return re.search(said, output, re.M) is not None


def container_of(data: Path, job: str) -> str:
    container = json.loads((data / "jobs" / job / "job.json").read_text())["container_id"]
    assert container
    return str(container)


def apply_with_the_agent_stopped(
    dstack: Dstack, data: Path, job: str, host: str, docker_client: Any
) -> None:
    """SIGSTOP the agent serving `data`, then `dstack apply` again: it succeeds, says it
    restarted the agent, whose successor answers and re-adopted the job's container."""
    container = container_of(data, job)
    pid = read_pid(DataDir(data))
    assert pid is not None and running(pid)
    os.kill(pid, signal.SIGSTOP)
    try:
        again = dstack("apply", "-y", timeout=PATIENCE)
    finally:
        if running(pid):
            os.kill(pid, signal.SIGCONT)  # a failed test leaves no stopped agent behind
    output = again.stdout + again.stderr
    assert again.returncode == 0, output
    assert restarted(again.stderr, host, pid), output
    assert "Traceback" not in output
    wait_until(lambda: not running(pid), f"the stopped agent (pid {pid}) exits")
    new = read_pid(DataDir(data))
    assert new is not None and new != pid and running(new)

    # the new agent answers (ps asks it), and the job runs on in the same container
    wait_for_status(dstack, "task.box", {"running"}, timeout=PATIENCE)
    assert container_of(data, job) == container
    assert docker_client.containers.get(container).status == "running"
    log = (data / "agent.log").read_text(errors="replace")
    assert f"re-adopting job {job}" in log


@pytest.mark.ssh
def test_an_ssh_hosts_stopped_agent_is_restarted_by_the_next_apply(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    docker_client: Any,
) -> None:
    image = ensure_busybox_image(docker_client)
    project = tmp_path / "project"
    write_fleet(project, ssh_hosts, "h1")
    (project / "box.dstack.yml").write_text(task(image, "fleets: [onprem]\n"))
    try:
        applied = dstack("apply", "-y", timeout=PATIENCE)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        wait_for_status(dstack, "task.box", {"running"}, timeout=PATIENCE)
        job = state(project)["resources"]["task.box"]["attributes"]["jobs"][0]["id"]
        data = remote / "hosts" / "h1" / "data"
        apply_with_the_agent_stopped(dstack, data, job, ssh_hosts["h1"].address, docker_client)
    finally:
        destroyed = dstack("destroy", "-y", timeout=PATIENCE)
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr


def test_the_local_stopped_agent_is_restarted_by_the_next_apply(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, docker_client: Any
) -> None:
    image = ensure_busybox_image(docker_client)
    project = tmp_path / "project"
    (project / "box.dstack.yml").write_text(task(image))
    try:
        applied = dstack("apply", "-y", timeout=PATIENCE)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        wait_for_status(dstack, "task.box", {"running"}, timeout=PATIENCE)
        job = state(project)["resources"]["task.box"]["attributes"]["jobs"][0]["id"]
        apply_with_the_agent_stopped(dstack, agent_dir, job, "localhost", docker_client)
    finally:
        destroyed = dstack("destroy", "-y", timeout=PATIENCE)
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
