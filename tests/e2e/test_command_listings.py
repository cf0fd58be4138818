"""A command asks each host for its jobs once (issue 36, `fleets/listings.py`).

- On the local fleet, an apply of N tasks reads this machine's host facts and lists its jobs
  at most once (it read the host facts once per run, 5,072 times for 1,000 tasks), and a
  destroy of them lists the jobs once (it listed them once per run).
- Removing K runs from an SSH fleet of H hosts lists each host at most once, however many
  runs go, and stops each job once: it listed every host of the fleet for every run removed
  (3,010 requests to remove 300 runs from 10 hosts).

The runs are made by the CLI as a user runs it (the SSH ones); the commands counted are the
same CLI run in this process, every request it makes to an agent counted on the real client
(`AgentClient._request`).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dstack_plan.agent.client import AgentClient
from dstack_plan.config.loader import PendingLoad
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.e2e.test_ssh_fleet import fleet_text, remote  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.timeout(300)

HOSTS = ("h1", "h2", "h3")
RUNS = 6
Requests = list[tuple[str, str, str]]
"""(host, method, path) of each request to an agent."""


def _tasks(count: int, fleet: str | None = None) -> str:
    fleets = f"fleets: [{fleet}]\n" if fleet else ""
    return "---\n".join(
        f"type: task\nname: t{i}\n{fleets}commands: ['sleep 300']\nstop_duration: 1s\n"
        "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}\n"
        for i in range(count)
    )


def _counting(monkeypatch: pytest.MonkeyPatch) -> Requests:
    """Every request an agent client makes from now on."""
    requests: Requests = []
    real = AgentClient._request

    async def counted(self: AgentClient, method: str, path: str, **kwargs: Any) -> Any:
        requests.append((self.host, method, path))
        return await real(self, method, path, **kwargs)

    monkeypatch.setattr(AgentClient, "_request", counted)
    return requests


def _dstack_here(cli_env: dict[str, str], *args: str) -> str:
    """`dstack ARGS` run in this process (the cwd is the project); its output."""
    from dstack_plan.cli.app import app

    done = CliRunner().invoke(app, list(args), env=cli_env)
    assert done.exit_code == 0, done.output
    return done.output


def _asked(requests: Requests, method: str, path: str) -> Counter[str]:
    """How many times each host was asked `method path`."""
    return Counter(host for host, m, p in requests if (m, p) == (method, path))


def _stops(requests: Requests) -> int:
    return sum(1 for _, method, path in requests if method == "POST" and path.endswith("/stop"))


def test_apply_and_destroy_on_the_local_fleet_ask_the_machine_once(
    tmp_path: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "tasks.dstack.yml").write_text(_tasks(RUNS))
    monkeypatch.chdir(project)
    requests = _counting(monkeypatch)

    applied = _dstack_here(cli_env, "apply", "-y")
    assert f"Resources: {RUNS} added" in applied
    assert sum(1 for _, m, p in requests if (m, p) == ("POST", "/jobs")) == RUNS
    assert sum(_asked(requests, "GET", "/host").values()) <= 1
    assert sum(_asked(requests, "GET", "/jobs").values()) <= 1

    requests.clear()
    destroyed = _dstack_here(cli_env, "destroy", "-y")
    assert f"Resources: {RUNS} destroyed" in destroyed
    assert sum(_asked(requests, "GET", "/jobs").values()) == 1
    assert sum(_asked(requests, "GET", "/host").values()) <= 1
    assert _stops(requests) == RUNS  # each job stopped once
    assert not state(project)["resources"]


def test_a_plan_asks_the_agent_for_its_jobs_before_it_has_parsed_the_files(
    tmp_path: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent builds its listing while the plan parses the configuration, and the
    refresh then uses that one listing."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "tasks.dstack.yml").write_text(_tasks(RUNS))
    monkeypatch.chdir(project)
    assert f"Resources: {RUNS} added" in _dstack_here(cli_env, "apply", "-y")
    requests = _counting(monkeypatch)
    asked_before_parsed: list[int] = []
    finish = PendingLoad.finish

    def finishing(self: PendingLoad) -> Any:
        # the parsing holds here until the agent is asked: a plan that asked only after it
        # had parsed never gets there (the wait is a bound on failing, not a measurement)
        for _ in range(6000):
            if _asked(requests, "GET", "/jobs"):
                break
            time.sleep(0.01)
        asked_before_parsed.append(sum(_asked(requests, "GET", "/jobs").values()))
        return finish(self)

    monkeypatch.setattr(PendingLoad, "finish", finishing)
    planned = _dstack_here(cli_env, "plan")
    assert "No changes." in planned
    assert asked_before_parsed == [1]
    assert sum(_asked(requests, "GET", "/jobs").values()) == 1
    _dstack_here(cli_env, "destroy", "-y")


@pytest.mark.ssh
def test_removing_runs_from_an_ssh_fleet_lists_each_host_once(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(fleet_text(ssh_hosts, "onprem", *HOSTS))
    (project / "tasks.dstack.yml").write_text(_tasks(RUNS, "onprem"))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    runs = [a for a in state(project)["resources"] if a.startswith("task.")]
    assert len(runs) == RUNS

    # the tasks leave the project: the apply removes all of them, the fleet stays
    (project / "tasks.dstack.yml").unlink()
    monkeypatch.chdir(project)
    requests = _counting(monkeypatch)
    removed = _dstack_here(cli_env, "apply", "-y")
    assert f"Resources: 0 added, 0 changed, {RUNS} destroyed" in removed

    listings = _asked(requests, "GET", "/jobs")
    assert listings, requests
    assert max(listings.values()) == 1, listings  # one listing per host for the command
    assert len(listings) <= len(HOSTS)
    assert _stops(requests) == RUNS
    assert list(state(project)["resources"]) == ["fleet.onprem"]
