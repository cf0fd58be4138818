"""Where a plan's runs on one fleet go: the scheduler's inputs from the desired runs and the
jobs on each of the fleet's hosts, and its decisions as the plan's placements. Pure; the
caller asks the agents.

Runs the plan keeps as they are come first: what they hold, they keep. Then the runs it starts
(creates, replaces, scales), higher `priority` first and in configuration order among equals,
each seeing what the earlier ones will take, so two new runs never count on the same GPUs or
port, and an important run is not crowded out by a less important one of the same batch.

What holds each host is tallied once (`scheduler/ledger.py`) and kept up to date as runs are
placed: a run's own jobs are taken out of the tally while it is placed (and back in unless
it starts somewhere), the jobs of a run placed are added. Placing N runs costs N times what
one run's jobs and the hosts' GPUs cost, not N times the jobs on the hosts.
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
from dstack_plan.scheduler.ledger import HostLedger
from dstack_plan.scheduler.placement import (
    PORTS,
    Candidate,
    Decision,
    HostJob,
    JobDemand,
    held_by,
    place,
)

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
    tally = _Tally(hosts, busy, deployment)
    candidates = [host._replace(busy=(), ledger=tally.ledgers[host.host]) for host in hosts]
    started: set[str] = set()
    for run in sorted(runs, key=_order):  # stable: kept runs, then by priority
        # the run's own jobs do not count against it; those of the runs started before it
        # are out of the tally already (the jobs placed for them stand in their place)
        own = tally.take_out(run.name) if run.name not in started else []
        demands = job_demands(run.spec, run.replicas)
        decision = _decide(run, demands, hosts, candidates, labels, bandwidth, volumes)
        placements[run.address] = _placement(hosts, decision)
        if run.starts and decision.never:
            hint = f"; {PROCESS_PORT_HINT}" if _process_port_clash(run, decision) else ""
            never[run.address] = f"{run.address} cannot run on any fleet: {decision.reason}{hint}"
        if run.starts and decision.placed:
            started.add(run.name)
            for demand, chosen in zip(demands, decision.hosts, strict=True):
                tally.ledgers[chosen.host].add(held_by(demand, run.address, chosen.resources.gpus))
        else:
            tally.put_back(run.name, own)
    return FleetPlacements(placements, never)


def _decide(
    run: HostRun,
    demands: Sequence[JobDemand],
    hosts: Sequence[Candidate],
    candidates: Sequence[Candidate],
    labels: Mapping[str, Labels] | None,
    bandwidth: Mapping[tuple[str, str], float] | None,
    volumes: Mapping[str, VolumeSite] | None,
) -> Decision:
    """Where `run`'s jobs (`demands`) go among `candidates`, the fleet's `hosts` with what
    holds them now."""
    distinct = isinstance(run.spec, TaskSpec) and run.spec.node_count() > 1
    wants = Wants.of(run.spec)
    needs = volume_needs(run.spec, hosts[0].fleet, hosts[0].provider, volumes or {})
    if needs.never is not None:
        return Decision(reason=needs.never)
    if needs.zone is not None:  # the machine must be where its volumes are
        wants = wants._replace(required={**wants.required, ZONE: needs.zone})
    return choose(  # only hosts with the labels the run requires (`labels`, by host)
        lambda eligible: place(demands, eligible, distinct, bandwidth=bandwidth),
        candidates,
        wants,
        labels or {},
    )


def _order(run: HostRun) -> tuple[bool, int]:
    """Kept runs first (they hold what they have), then the started ones by priority."""
    return (run.starts, -run.spec.priority if run.starts else 0)


class _Tally:
    """What holds each host of the fleet, one ledger per host (`scheduler/ledger.py`), and
    where the jobs of each run of `deployment` are in them."""

    def __init__(
        self,
        hosts: Sequence[Candidate],
        busy: Mapping[str, Sequence[BusyJob]],
        deployment: str | None,
    ) -> None:
        self.ledgers = {h.host: HostLedger() for h in hosts}
        self._of_run: dict[str, list[tuple[str, int, HostJob]]] = {}
        """Run name -> (host, key, job) of each of its jobs (this project's)."""
        for host in hosts:
            ledger = self.ledgers[host.host]
            for job in busy.get(host.host, ()):
                key = ledger.add(job.held)
                if job.deployment == deployment:
                    self._of_run.setdefault(job.run_name, []).append((host.host, key, job.held))

    def take_out(self, run_name: str) -> list[tuple[str, int, HostJob]]:
        """Take the jobs of this project's run `run_name` out of the ledgers: what to
        `put_back` if they stay."""
        own = self._of_run.pop(run_name, [])
        for host, key, job in own:
            self.ledgers[host].remove(key, job)
        return own

    def put_back(self, run_name: str, own: list[tuple[str, int, HostJob]]) -> None:
        """The jobs `take_out` took of `run_name`, back where they were."""
        if not own:
            return
        for host, key, job in own:
            self.ledgers[host].add(job, key)
        self._of_run.setdefault(run_name, []).extend(own)


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
