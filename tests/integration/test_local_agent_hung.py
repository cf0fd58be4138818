"""The local provider reuses the running agent only when it answers; one that runs but does not
(SIGSTOPped here) is stopped and another started, as any restart of the agent (its process jobs
end `executor_error`). `agent stop` reaches a stopped agent, and only the one it was told.

Real agent processes on temp data dirs; no test waits on a duration: each waits for a
condition, with a generous limit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dstack_plan.agent import daemon
from dstack_plan.agent.api_models import JobSpec
from dstack_plan.agent.client import health_wait
from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.protocol import HEALTH_TIMEOUT
from dstack_plan.providers.local import AGENT_START_TIMEOUT, LocalProvider
from tests.infra.agent_process import AgentProcess, kill_job_groups

PATIENCE = 60.0
"""Seconds any condition gets (the machine may be loaded); never a duration asserted."""


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {PATIENCE:g}s"
        time.sleep(0.05)


def set_started_at(data: Path, when: float) -> None:
    """Make the agent's connection file say it started at `when`."""
    connection = data / "agent.json"
    info = json.loads(connection.read_text())
    info["started_at"] = when
    connection.write_text(json.dumps(info))


def test_the_health_wait_is_short_unless_the_agent_may_still_be_starting() -> None:
    assert health_wait(None, 20.0) == HEALTH_TIMEOUT  # age not known
    assert health_wait(3600.0, 20.0) == HEALTH_TIMEOUT
    assert health_wait(2.0, 20.0) == 18.0  # what is left of a fresh start's wait
    assert health_wait(-5.0, 20.0) == 20.0  # started "after now": just started
    assert health_wait(19.0, 20.0) == HEALTH_TIMEOUT


def test_stop_with_a_pid_leaves_another_agent_running(agent: AgentProcess) -> None:
    assert agent.proc is not None
    data = DataDir(agent.data_dir)
    assert daemon.stop(data, PATIENCE, pid=agent.proc.pid + 100_000) is False
    assert agent.proc.poll() is None


def test_stop_reaches_a_stopped_agent_with_sigterm(agent: AgentProcess) -> None:
    """SIGCONT after SIGTERM: the stopped agent shuts down as asked (it removes its pid file;
    a SIGKILL would leave it), well before the generous SIGKILL deadline."""
    assert agent.proc is not None
    os.kill(agent.proc.pid, signal.SIGSTOP)
    assert daemon.stop(DataDir(agent.data_dir), PATIENCE, pid=agent.proc.pid) is True
    assert agent.proc.wait(timeout=PATIENCE) == 0
    assert not (agent.data_dir / "agent.pid").exists()


async def test_a_stopped_local_agent_is_replaced_and_its_process_job_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "agent"
    old = AgentProcess(data).start()
    assert old.proc is not None
    provider = LocalProvider(data)
    try:
        client = old.client()
        await client.submit(JobSpec(id="sleeper", run_name="r", commands=["sleep 600"]))
        wait_until(lambda: _status(data, "sleeper") == "running", "the job runs")
        set_started_at(data, time.time() - 3600)  # long past the wait a fresh start gets
        os.kill(old.proc.pid, signal.SIGSTOP)

        local = provider.client()
        assert (await local.health()).status == "ok"
        assert provider.replaced_pid == old.proc.pid
        assert provider.started is not None and provider.started.pid != old.proc.pid
        assert old.proc.wait(timeout=PATIENCE) is not None
        said = (
            f"localhost: agent (pid {old.proc.pid}) did not answer within "
            f"{HEALTH_TIMEOUT:g}s; restarted it"
        )
        assert any(r.levelno == logging.WARNING and r.getMessage() == said for r in caplog.records)
        job = await local.get_job("sleeper")
        assert job.status.value == "failed"
        assert job.termination_reason is not None
        assert job.termination_reason.value == "executor_error"
    finally:
        await provider.close()
        daemon.stop(DataDir(data), PATIENCE)
        if old.proc.poll() is None:
            os.kill(old.proc.pid, signal.SIGCONT)  # a failed test leaves no stopped agent
        old.kill()
        kill_job_groups(data)


async def test_a_local_agent_that_may_still_be_starting_is_waited_for(tmp_path: Path) -> None:
    """Younger than a fresh start's wait, it gets the rest of that wait: it answers once it
    goes on (SIGCONT when the provider's request waits in its accept queue) and is reused."""
    data = tmp_path / "agent"
    old = AgentProcess(data).start()
    assert old.proc is not None and health_wait(0, AGENT_START_TIMEOUT) > HEALTH_TIMEOUT
    port = int(old.info["port"])
    # a start time ahead of the clock counts as just now: the test's pace does not matter
    set_started_at(data, time.time() + 3600)
    os.kill(old.proc.pid, signal.SIGSTOP)

    def queued() -> bool:
        listening = subprocess.run(
            ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True
        ).stdout.split()
        return len(listening) > 1 and int(listening[1]) > 0  # Recv-Q: connections to accept

    def go_on_when_asked() -> None:
        try:
            wait_until(queued, "the provider asks the stopped agent")
        finally:
            os.kill(old.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]

    resumer = threading.Thread(target=go_on_when_asked)
    resumer.start()
    provider = LocalProvider(data)
    try:
        assert (await provider.client().health()).status == "ok"
        resumer.join()
        assert provider.replaced_pid is None and provider.started is None
        assert old.proc.poll() is None
    finally:
        resumer.join()
        await provider.close()
        old.kill()


def _status(data: Path, job: str) -> str | None:
    try:
        return str(json.loads((data / "jobs" / job / "job.json").read_text())["status"])
    except (OSError, ValueError, KeyError):
        return None
