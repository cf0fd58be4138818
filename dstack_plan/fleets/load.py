"""What the machines of a fleet hold now, asked of their agents: the scheduler's candidates.

Plan and apply place runs from the same inputs: every machine that can take jobs (its
resources known, its last check passed, its agent answering now) with the jobs on it and the
labels it carries (`scheduler/labels.py`: which runs may use it, which prefer it). One job
listing per machine, all machines side by side (within a command, the one it already made:
`fleets/listings.py`).
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.host_load import BusyJob, busy_jobs
from dstack_plan.fleets.machines import FleetMachines, Machine
from dstack_plan.fleets.records import FleetRecord, host_labels, is_cloud_fleet
from dstack_plan.providers.local import LOCAL_FLEET
from dstack_plan.scheduler.labels import Labels, machine_labels
from dstack_plan.scheduler.placement import Candidate
from dstack_plan.state.model import ResourceState, State


class FleetLoad(NamedTuple):
    candidates: list[Candidate]
    """The machines that can take jobs now, in the fleet's order."""
    busy: dict[str, list[BusyJob]]
    """What holds part of each candidate, by host name."""
    problems: dict[str, str]
    """Host name -> why it cannot take jobs now (unreachable, agent down)."""
    machines: dict[str, Machine]
    """The candidates' machines, by host name (what a placement's hosts name)."""
    labels: dict[str, Labels] = {}
    """The candidates' labels, by host name: their host entries' and `gpu.model`."""
    bandwidth: dict[tuple[str, str], float] = {}
    """The fleet's links as `dstack fleet probe` last measured them: (src, dst) -> bytes/s."""

    def why_none(self) -> str:
        """Why the fleet has no candidate, per host."""
        return "; ".join(f"{h}: {p}" for h, p in self.problems.items()) or "it has no hosts"


async def fleet_load(
    machines: FleetMachines, fleet: str, state: State, deployment: str
) -> FleetLoad:
    """The fleet's candidates and what runs on them (the jobs of `deployment` are labelled
    as this project's). An SSH host whose agent does not answer is left out, with why; the
    local machine's errors are raised (it is this machine)."""
    found = await machines.machines(fleet, state)
    problems = {m.host: m.problem for m in found if m.problem}
    usable = [m for m in found if m.usable]

    async def listing(machine: Machine) -> tuple[Machine, list[BusyJob] | str]:
        try:
            return machine, busy_jobs(await machines.jobs(fleet, machine.host, state), deployment)
        except DstackPlanError as e:
            if fleet == LOCAL_FLEET:
                raise
            return machine, str(e)

    candidates: list[Candidate] = []
    busy: dict[str, list[BusyJob]] = {}
    answering: dict[str, Machine] = {}
    labels: dict[str, Labels] = {}
    entry = machines.recorded(fleet, state) if fleet != LOCAL_FLEET else None
    given = _given_labels(entry)
    measured = FleetRecord.of(entry).bandwidth if entry is not None else None
    bandwidth = measured.matrix() if measured is not None else {}
    for machine, jobs in await asyncio.gather(*(listing(m) for m in usable)):
        if isinstance(jobs, str):
            problems[machine.host] = jobs
            continue
        assert machine.resources is not None
        candidates.append(
            Candidate(machine.fleet, machine.provider, machine.host, machine.resources)
        )
        busy[machine.host] = jobs
        answering[machine.host] = machine
        labels[machine.host] = machine_labels(machine.resources, given.get(machine.host, {}))
    return FleetLoad(candidates, busy, problems, answering, labels, bandwidth)


def _given_labels(entry: ResourceState | None) -> dict[str, dict[str, tuple[str, ...]]]:
    """The labels each host carries besides `gpu.model`: an SSH fleet's host entries', a
    cloud fleet's zones."""
    if entry is None:
        return {}
    if is_cloud_fleet(entry):
        from dstack_plan.fleets.cloud_records import CloudFleetRecord, cloud_host_labels

        return cloud_host_labels(CloudFleetRecord.of(entry))
    return host_labels(entry) if entry.provider == "ssh" else {}
