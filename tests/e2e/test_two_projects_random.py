"""Two projects on the same three hosts, in random interleavings of directory applies, `-f`
submissions, SDK submissions, stops, destroys, watch ticks and a fleet naming the other
project's host. After every step, every run a project started and did not stop itself still
runs, and no agent runs on a host that no fleet of either state lists.

Project A's fleet holds h1 and h2, B's holds h3; each declares one long task in its files.
The steps run in process, through the same `Project` API the CLI uses (a step is a plan and
an apply under the state's lock, a watch tick, a stop), so fifty of them fit in a few
minutes. The seed is printed on failure; `DSTACK_PLAN_RANDOM_SEED` replays one.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dstack_plan.errors import DstackPlanError, PlanError
from dstack_plan.inspect.runs import list_runs
from dstack_plan.inspect.stop import stop_run
from dstack_plan.plan.planner import PlanOptions
from dstack_plan.project import Project
from dstack_plan.sdk import asubmit_task
from dstack_plan.watch.loop import Watcher
from tests.e2e.test_ssh_fleet import agents_running, fleet_text, remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_runs import task
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 50
HOSTS = {"a": ("h1", "h2"), "b": ("h3",)}


@dataclass
class Side:
    """One project and the runs it started and has not stopped (what must still run)."""

    name: str
    directory: Path
    running: set[str] = field(default_factory=set)
    counter: int = 0

    @property
    def fleet(self) -> str:
        return f"pool-{self.name}"

    def next_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.name}{self.counter}"


def _long(name: str, fleet_name: str) -> str:
    return task(name, 1, ["sleep 600"]).replace("fleets: [onprem]", f"fleets: [{fleet_name}]")


async def _apply(directory: Path, *files: str, destroy: bool = False) -> Project:
    project = Project(directory, tuple(files))
    try:
        async with project.locked("destroy" if destroy else "apply", timeout=60):
            plan, _ = await project.plan(PlanOptions(destroy=destroy))
            if plan.has_changes:
                report = await project.apply(plan)
                assert report.ok, report
    finally:
        await project.close()
    return project


async def _step(side: Side, other: Side, op: str, hosts: SSHTestHosts, outside: Path) -> None:
    if op == "apply":  # the directory: its fleet and declared task, submissions kept
        declared = f"task.decl-{side.name}"
        new = Project(side.directory).backend.read().state.get(declared) is None
        await _apply(side.directory)
        if new:  # a stopped task stays stopped: its spec did not change
            side.running.add(declared)
    elif op == "apply-f":
        name = side.next_name("sub")
        path = outside / f"{name}.dstack.yml"
        path.write_text(_long(name, side.fleet))
        await _ensure_fleet(side)
        await _apply(side.directory, str(path))
        side.running.add(f"task.{name}")
    elif op == "sdk":
        name = side.next_name("sdk")
        await _ensure_fleet(side)
        await asubmit_task(
            commands=["sleep 600"], name=name, fleets=[side.fleet], project=side.directory,
            stop_duration="1s", resources={"cpu": "1..", "memory": "0.1GB..", "disk": "1GB.."},
        )  # fmt: skip
        side.running.add(f"task.{name}")
    elif op == "stop" and side.running:
        address = sorted(side.running)[0]
        project = Project(side.directory)
        try:
            await stop_run(project, address, abort=True)
        finally:
            await project.close()
        side.running.discard(address)
    elif op == "destroy":
        await _apply(side.directory, destroy=True)
        side.running.clear()
    elif op == "watch":
        project = Project(side.directory)
        try:
            await Watcher(project).tick()
        finally:
            await project.close()
    elif op == "intrude":  # a fleet naming the other project's host is refused
        path = outside / f"intruder-{side.name}.dstack.yml"
        path.write_text(fleet_text(hosts, f"grab-{side.name}", HOSTS[other.name][0]))
        if not _fleet_recorded(other):
            return  # nobody owns the host now: nothing to refuse
        with pytest.raises(PlanError, match="belongs to fleet.pool-"):
            await _apply(side.directory, str(path))


async def _ensure_fleet(side: Side) -> None:
    if not _fleet_recorded(side):
        await _apply(side.directory, str(side.directory / "fleet.dstack.yml"))


def _fleet_recorded(side: Side) -> bool:
    project = Project(side.directory)
    return project.backend.read().state.get(f"fleet.{side.fleet}") is not None


async def _check(sides: list[Side], agents: Path, step: str) -> None:
    listed: set[str] = set()
    for side in sides:
        project = Project(side.directory)
        project.machines.start_agents = False  # looking must not start anything
        try:
            state = project.backend.read().state
            if state.get(f"fleet.{side.fleet}") is not None:
                listed |= set(HOSTS[side.name])
            views = await list_runs(project, all_runs=True, addresses=set(side.running))
        finally:
            await project.close()
        status = {v.address: (v.status, v.error) for v in views}
        for address in side.running:
            assert status.get(address, ("missing", None))[0] == "running", (
                f"after {step}: {side.name}'s {address} is {status.get(address)}"
            )
    found = agents_running(agents)
    assert found <= listed, f"after {step}: agents on {found}"


def test_two_projects_in_random_interleavings(
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    monkeypatch: pytest.MonkeyPatch,
    agent_dir: Path,
    remote: Path,  # noqa: F811 - stops what a failed run leaves on the hosts
) -> None:
    seed = int(os.environ.get("DSTACK_PLAN_RANDOM_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DSTACK_PLAN_SSH_AGENT_DIR", str(remote))
    monkeypatch.setenv("DSTACK_PLAN_AGENT_DIR", str(agent_dir))
    outside = tmp_path / "submissions"
    outside.mkdir()
    sides = []
    for name in ("a", "b"):
        directory = tmp_path / name
        directory.mkdir()
        side = Side(name, directory)
        (directory / "fleet.dstack.yml").write_text(
            fleet_text(ssh_hosts, side.fleet, *HOSTS[name])
        )
        (directory / "decl.dstack.yml").write_text(_long(f"decl-{name}", side.fleet))
        sides.append(side)
    ops = ["apply", "apply-f", "sdk", "stop", "destroy", "watch", "intrude"]
    weights = [4, 3, 3, 2, 1, 3, 1]
    done: list[str] = []

    async def run() -> None:
        for side in sides:
            await _step(side, side, "apply", ssh_hosts, outside)
        for number in range(STEPS):
            index = rng.randrange(2)
            side, other = sides[index], sides[1 - index]
            op = rng.choices(ops, weights)[0]
            step = f"step {number} ({side.name}: {op})"
            done.append(step)
            try:
                await _step(side, other, op, ssh_hosts, outside)
            except DstackPlanError as e:
                raise AssertionError(f"{step} failed: {e}") from e
            await _check(sides, remote, step)
        for side in sides:
            await _apply(side.directory, destroy=True)
        assert agents_running(remote) == set()

    try:
        asyncio.run(run())
    except BaseException:
        print(f"seed {seed}; steps: {', '.join(done)}")
        raise
