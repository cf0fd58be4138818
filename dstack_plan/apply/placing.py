"""Where a plan's runs on one host go: the scheduler's inputs from the desired runs and the
jobs on the host, and its decisions as the plan's placements. Pure; the caller asks the agent.

Runs the plan keeps as they are come first: what they hold, they keep. Then the runs it starts
(creates, replaces, scales), in configuration order, each seeing what the earlier ones will
take, so two new runs never count on the same GPUs or port.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from dstack_plan.apply.host_load import BusyJob
from dstack_plan.apply.jobs import job_demands
from dstack_plan.config.runs import RunSpec, TaskSpec
from dstack_plan.plan.model import Placement
from dstack_plan.scheduler.matching import gpus_wanted
from dstack_plan.scheduler.placement import PORTS, Candidate, Decision, HostJob, place

PROCESS_PORT_HINT = (
    "a job without an image binds its port on the host itself: give the run an `image:`, "
    "so Docker maps each replica's port to a free host port, or run fewer replicas"
)


class HostRun(NamedTuple):
    """A run to place on the host."""

    address: str
    name: str
    spec: RunSpec
    starts: bool
    """The plan starts it (create, replace, scale); False: it stays as it is."""


class HostPlacements(NamedTuple):
    placements: dict[str, Placement]
    never: list[str]
    """`ADDRESS cannot run on any fleet: why`, for each run the plan would start that no
    machine could ever take."""


def place_on_host(
    runs: Sequence[HostRun], host: Candidate, busy: Sequence[BusyJob], deployment: str
) -> HostPlacements:
    """Placements for `runs` on `host`, given the jobs `busy` on it now (those of
    `deployment`, this project's state, are told apart by run name)."""
    placements: dict[str, Placement] = {}
    never: list[str] = []
    planned: list[HostJob] = []
    started: set[str] = set()
    for run in sorted(runs, key=lambda r: r.starts):  # stable: kept runs first
        mine = {run.name} | started  # the run's own jobs, and those replaced by `planned`
        others = [b.held for b in busy if not (b.deployment == deployment and b.run_name in mine)]
        demands = job_demands(run.spec)
        decision = place(
            demands,
            [host._replace(busy=(*others, *planned))],
            distinct=isinstance(run.spec, TaskSpec) and run.spec.node_count() > 1,
        )
        placements[run.address] = _placement(host, decision)
        if not run.starts:
            continue
        if decision.never:
            hint = f"; {PROCESS_PORT_HINT}" if _process_port_clash(run, decision) else ""
            never.append(f"{run.address} cannot run on any fleet: {decision.reason}{hint}")
        elif decision.placed:
            started.add(run.name)
            planned += [
                HostJob(run.address, gpus_wanted(d.resources.gpu), d.ports) for d in demands
            ]
    return HostPlacements(placements, never)


def _placement(host: Candidate, decision: Decision) -> Placement:
    if decision.placed:
        note = None
    elif decision.pending:
        note = f"pending: {decision.reason}"
    else:
        note = f"cannot be placed: {decision.reason}"
    return Placement(
        fleet=host.fleet,
        provider=host.provider,
        hosts=tuple(c.host for c in decision.hosts),
        price_per_hour=decision.price_per_hour,
        placed=decision.placed,
        pending=decision.pending,
        note=note,
    )


def _process_port_clash(run: HostRun, decision: Decision) -> bool:
    return run.spec.image is None and PORTS in decision.blocked_by
