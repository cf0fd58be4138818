"""Where a plan's runs on one fleet go: the scheduler's inputs from the desired runs and the
jobs on each of the fleet's hosts, and its decisions as the plan's placements. Pure; the
caller asks the agents.

Runs the plan keeps as they are come first: what they hold, they keep. Then the runs it starts
(creates, replaces, scales), higher `priority` first and in configuration order among equals,
each seeing what the earlier ones will take, so two new runs never count on the same GPUs or
port, and an important run is not crowded out by a less important one of the same batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from dstack_plan.config.labels import ZONE
from dstack_plan.config.runs import RunSpec, TaskSpec
from dstack_plan.fleets.host_load import BusyJob
from dstack_plan.plan.model import Placement
from dstack_plan.runs.jobs import job_demands
from dstack_plan.runs.volume_mounts import VolumeSite, volume_needs
from dstack_plan.scheduler.labels import Labels, Wants, choose
from dstack_plan.scheduler.placement import PORTS, Candidate, Decision, HostJob, held_by, place

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
    replicas: int | None = None
    """Place this many replicas of a service (a scale-up's new ones), not its configured
    count."""


class FleetPlacements(NamedTuple):
    placements: dict[str, Placement]
    never: dict[str, str]
    """address -> `ADDRESS cannot run on any fleet: why`, for each run the plan would start
    that no machine could ever take."""


def place_on_fleet(
    runs: Sequence[HostRun],
    hosts: Sequence[Candidate],
    busy: Mapping[str, Sequence[BusyJob]],
    deployment: str | None,
    labels: Mapping[str, Labels] | None = None,
    bandwidth: Mapping[tuple[str, str], float] | None = None,
    volumes: Mapping[str, VolumeSite] | None = None,
) -> FleetPlacements:
    """Placements for `runs` on one fleet's `hosts` (at least one; ties between equally good
    hosts go by host name), given the jobs `busy` on each now, by host name. The jobs of
    `deployment`, this project's state, are told apart by run name: a run's own jobs do not
    count against it (None: every job counts, as when a scale-up adds to what a run holds).
    `bandwidth`: the fleet's measured links, (src, dst) -> bytes/s; gangs prefer the best.
    `volumes`: where each network volume is, by name: a run that mounts one goes to a
    machine in its zone (`runs/volume_mounts.py`)."""
    placements: dict[str, Placement] = {}
    never: dict[str, str] = {}
    planned: dict[str, list[HostJob]] = {h.host: [] for h in hosts}
    started: set[str] = set()
    for run in sorted(runs, key=_order):  # stable: kept runs, then by priority
        mine = {run.name} | started  # the run's own jobs, and those replaced by `planned`
        candidates = [
            host._replace(
                busy=(*_others(busy.get(host.host, ()), mine, deployment), *planned[host.host])
            )
            for host in hosts
        ]
        demands = job_demands(run.spec, run.replicas)
        distinct = isinstance(run.spec, TaskSpec) and run.spec.node_count() > 1
        wants = Wants.of(run.spec)
        needs = volume_needs(run.spec, hosts[0].fleet, hosts[0].provider, volumes or {})
        if needs.never is not None:
            placements[run.address] = _placement(hosts, Decision(reason=needs.never))
            if run.starts:
                never[run.address] = f"{run.address} cannot run on any fleet: {needs.never}"
            continue
        if needs.zone is not None:  # the machine must be where its volumes are
            wants = wants._replace(required={**wants.required, ZONE: needs.zone})
        decision = choose(  # only hosts with the labels the run requires (`labels`, by host)
            lambda eligible: place(demands, eligible, distinct, bandwidth=bandwidth),  # noqa: B023
            candidates,
            wants,
            labels or {},
        )
        placements[run.address] = _placement(hosts, decision)
        if not run.starts:
            continue
        if decision.never:
            hint = f"; {PROCESS_PORT_HINT}" if _process_port_clash(run, decision) else ""
            never[run.address] = f"{run.address} cannot run on any fleet: {decision.reason}{hint}"
        elif decision.placed:
            started.add(run.name)
            for demand, chosen in zip(demands, decision.hosts, strict=True):
                planned[chosen.host].append(held_by(demand, run.address, chosen.resources.gpus))
    return FleetPlacements(placements, never)


def _order(run: HostRun) -> tuple[bool, int]:
    """Kept runs first (they hold what they have), then the started ones by priority."""
    return (run.starts, -run.spec.priority if run.starts else 0)


def _others(busy: Sequence[BusyJob], mine: set[str], deployment: str | None) -> list[HostJob]:
    """What holds part of a host besides the jobs of the runs in `mine` (this project's)."""
    return [b.held for b in busy if not (b.deployment == deployment and b.run_name in mine)]


def _placement(hosts: Sequence[Candidate], decision: Decision) -> Placement:
    fleet = hosts[0]
    if decision.placed:
        note = None
    elif decision.pending:
        note = f"pending: {decision.reason}"
    else:
        note = f"cannot be placed: {decision.reason}"
    return Placement(
        fleet=fleet.fleet,
        provider=fleet.provider,
        hosts=tuple(c.host for c in decision.hosts),
        price_per_hour=decision.price_per_hour,
        placed=decision.placed,
        pending=decision.pending,
        note=note,
    )


def _process_port_clash(run: HostRun, decision: Decision) -> bool:
    return run.spec.image is None and PORTS in decision.blocked_by
