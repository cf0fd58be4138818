"""Where the runs a plan holds go, decided when the plan is made, by the rules apply uses.

Each run goes to the first fleet it names (else the first declared, else `local`): on the
local fleet and on SSH fleets the plan leaves as they are, the scheduler places it on the
machines as their agents report them now (`fleets/load.py`, `runs/placing.py`); on a fleet
the plan creates or changes, apply places it ("machines known after apply"). A run its first
fleet cannot take may burst to a cloud fleet it names next (`runs/bursting.py`). Queued and
scheduled runs get their notes (`runs/queueing.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

from dstack_plan.agent.protocol import FINISHED_STATUSES
from dstack_plan.clock import Clock
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.resource import Desired, Resource
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import PlanError
from dstack_plan.fleets.load import fleet_load
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.fleets.records import is_cloud_fleet
from dstack_plan.plan.diff import diff_specs
from dstack_plan.plan.model import Placement
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.plan.planner import DesiredItem
from dstack_plan.providers.local import LOCAL_FLEET, LOCAL_PROVIDER
from dstack_plan.providers.names import ENGINES, HOST_FLEET_PROVIDERS
from dstack_plan.runs.placing import FleetPlacements, HostRun, place_on_fleet
from dstack_plan.runs.plan_victims import with_victims
from dstack_plan.runs.plan_wait import with_estimates
from dstack_plan.runs.records import RunRecord
from dstack_plan.sharing.imports import is_imported
from dstack_plan.state.model import State

if TYPE_CHECKING:
    from dstack_plan.config.volume import VolumeSpec
    from dstack_plan.providers.configured import ConfiguredClouds
    from dstack_plan.runs.volume_mounts import VolumeSite


class RunPlacement:
    """Plan-time placement of runs on the machines of their fleets."""

    def __init__(
        self,
        machines: FleetMachines,
        clouds: Callable[[], ConfiguredClouds],
        deployment: str,
        clock: Clock,
    ) -> None:
        self.machines = machines
        self._clouds = clouds
        """The configured clouds, built when a run first bursts to a cloud fleet."""
        self._deployment = deployment
        self.clock = clock

    async def placements(
        self,
        desired: Desired,
        items: Mapping[str, DesiredItem],
        state: State,
        starts: Callable[[str], bool],
    ) -> dict[str, Placement]:
        """Where each run would go, by the same rules apply uses (`fleets/load.py`).

        A run that fits but not now (what runs on the hosts holds the GPUs or ports it needs,
        or no host of its fleet answers) is pending, its note saying what it waits for. A run
        the plan would start that no machine could ever take is a PlanError naming, per
        candidate, why: one error for all such runs. A run on a fleet this plan creates or
        changes is placed by apply ("machines known after apply"). `starts(address)` tells
        whether the plan starts a run (a run it keeps as it is claims nothing new, so it is
        never refused).
        """
        runs = [r for r in desired if r.kind in RUN_KINDS]
        if not runs:
            return {}
        result: dict[str, Placement] = {}
        fleets = {r.name: r for r in desired.of_kind("fleet")}
        by_address = items
        per_fleet: dict[str, list[HostRun]] = {}
        for resource in runs:
            spec = resource.spec
            assert isinstance(spec, RunSpec)
            if not starts(resource.address):
                kept = recorded_placement(state, resource.address)
                if kept is not None:
                    # a run the plan keeps is where its jobs are, not where it would go:
                    # placing it again would decide nothing (a placement per running run)
                    result[resource.address] = kept
                    continue
            fleet = fleet_of(resource, fleets)
            provider = by_address[resource.address].provider
            if not placeable(fleet, provider, by_address, state):
                result[resource.address] = Placement(
                    fleet=fleet, provider=provider, note="machines known after apply"
                )
                continue
            run_starts = resource.address in by_address and starts(resource.address)
            per_fleet.setdefault(fleet, []).append(
                HostRun(resource.address, resource.name, spec, run_starts)
            )
        never: dict[str, str] = {}
        for fleet, fleet_runs in per_fleet.items():
            placed = await self._place_on(desired, fleet, fleet_runs, state)
            never.update(placed.never)
            result.update(placed.placements)
        claimed: dict[str, int] = {}  # fleet -> machines the runs before burst to it for
        for resource in runs:  # one its first fleet cannot take may burst to a cloud fleet
            left = result.get(resource.address)
            item = by_address.get(resource.address)
            if (
                left is None
                or left.placed is not False
                or item is None
                or not starts(resource.address)
            ):
                continue
            burst = await self._burst(desired, resource, left, by_address, state, claimed)
            if isinstance(burst, Placement):
                if burst.offer is not None:  # its new machines count against nodes.max
                    claimed[burst.fleet] = claimed.get(burst.fleet, 0) + burst.offer.count
                result[resource.address] = burst
                never.pop(resource.address, None)
            elif burst:  # the cloud fleets it names could not take it either: say why
                more = "; ".join(burst)
                result[resource.address] = left.model_copy(
                    update={"note": f"{left.note}; {more}" if left.note else more}
                )
                if resource.address in never:
                    never[resource.address] += f"; {more}"
        if never:
            raise PlanError("\n".join(never.values()))
        from dstack_plan.runs.queueing import plan_note  # queued and scheduled runs

        specs = {r.address: r.spec for r in runs}
        now = self.clock.now()
        return {a: plan_note(specs[a], p, now) for a, p in result.items()}

    async def _burst(
        self,
        desired: Desired,
        resource: Resource,
        left: Placement,
        items: Mapping[str, DesiredItem],
        state: State,
        claimed: Mapping[str, int],
    ) -> Placement | list[str]:
        """Where a run its first fleet cannot take goes instead: the first cloud fleet it
        names after that one, on machines up and free, or on new ones (`runs/bursting.py`);
        else why each cloud fleet it names could not take it."""
        spec = resource.spec
        assert isinstance(spec, RunSpec)
        why_not: list[str] = []
        for name in (spec.fleet_names() or ())[1:]:
            entry = state.get(f"fleet.{name}")
            item = items.get(f"fleet.{name}")
            if entry is None or item is None or not is_cloud_fleet(entry):
                continue
            if not placeable(name, item.provider, items, state):
                continue  # created or changed by this plan: its machines are not known yet
            run = HostRun(resource.address, resource.name, spec, True)
            up = (await self._place_on(desired, name, [run], state)).placements[resource.address]
            if up.placed:
                why = (left.note or "").removeprefix("pending: ")
                return up.model_copy(
                    update={"note": f"burst: {left.fleet} cannot take it now ({why})"}
                )
            from dstack_plan.config.fleet import FleetSpec
            from dstack_plan.fleets.cloud_records import CloudFleetRecord
            from dstack_plan.runs.bursting import burst_offer
            from dstack_plan.runs.volume_mounts import volume_needs

            fleet_spec = spec_from_normalized("fleet", dict(entry.spec))
            assert isinstance(fleet_spec, FleetSpec)
            providers = self._clouds().providers(entry.provider, state.lineage, creating=False)
            record = CloudFleetRecord.of(entry)
            needs = volume_needs(spec, name, entry.provider, self._volume_sites(desired, state))
            if needs.never is not None:
                why_not.append(f"fleet {name}: {needs.never}")
                continue
            offered = await burst_offer(
                spec, name, fleet_spec, record, providers, left, claimed.get(name, 0), needs.zone
            )
            if isinstance(offered, Placement):
                return offered
            why_not.append(offered)
        return why_not

    async def _place_on(
        self, desired: Desired, fleet: str, runs: list[HostRun], state: State
    ) -> FleetPlacements:
        deployment = self._deployment
        if any(run.starts for run in runs):  # what only keeps running needs no export
            self.machines.check_placeable(fleet)
        if self.machines.is_engine(fleet, state):  # Slurm, Kubernetes: the engine places them
            return await self._place_on_engine(fleet, runs, state)
        load = await fleet_load(self.machines, fleet, state, deployment)
        if load.candidates:
            volumes = self._volume_sites(desired, state)
            placed = place_on_fleet(
                runs, load.candidates, load.busy, deployment, load.labels, load.bandwidth, volumes
            )
            specs = {r.address: r.spec for r in runs}
            now = self.clock.now()
            estimated = with_estimates(
                placed.placements, specs, fleet, load.candidates, load.busy, state, now
            )
            # on a fleet it exports with guarantees: what the owner's watch would preempt for it
            named = await with_victims(self.machines, state, fleet, estimated, specs)
            return placed._replace(placements=named)
        note = f"pending: no host of fleet {fleet!r} can take jobs now ({load.why_none()})"
        provider = "ssh" if fleet != LOCAL_FLEET else LOCAL_PROVIDER
        waiting = Placement(fleet=fleet, provider=provider, placed=False, pending=True, note=note)
        return FleetPlacements({r.address: waiting for r in runs}, {})

    async def _place_on_engine(
        self, fleet: str, runs: list[HostRun], state: State
    ) -> FleetPlacements:
        """Runs on engine fleet `fleet` (Slurm, Kubernetes): each where its engine takes it
        (`runs/engine_runs.py`); one the cluster could never take is never placed."""
        from dstack_plan.runs.engine_runs import plan_placement

        placements: dict[str, Placement] = {}
        never: dict[str, str] = {}
        now = self.clock.now()
        for run in runs:
            placed = await plan_placement(self.machines, fleet, run.spec, state, now)
            placements[run.address] = placed
            if placed.placed is False and run.starts:
                never[run.address] = f"{run.address} cannot run on fleet {fleet}: {placed.note}"
        return FleetPlacements(placements, never)

    def _volume_sites(self, desired: Desired, state: State) -> dict[str, VolumeSite]:
        """Where each volume the project declares or state records lives."""
        from dstack_plan.runs.volume_mounts import volume_sites

        # `of_kind("volume")` holds VolumeSpecs only; a project without volumes never imports
        # their model
        declared = cast("list[VolumeSpec]", [r.spec for r in desired.of_kind("volume")])
        return volume_sites(state, declared)


def recorded_placement(state: State, address: str) -> Placement | None:
    """Where the run at `address` runs, or ran, as its state entry records its jobs (None
    when it has none: a queued run still waits for a placement)."""
    entry = state.get(address)
    if entry is None:
        return None
    record = RunRecord.of(entry)
    if not record.jobs:
        return None
    finished = entry.status in FINISHED_STATUSES
    return Placement(
        fleet=record.fleet,
        provider=entry.provider,
        hosts=tuple(sorted({j.host for j in record.jobs})),
        price_per_hour=record.price_per_hour,
        placed=True,
        note=f"ran there ({entry.status})" if finished else None,
    )


def fleet_of(resource: Resource, fleets: dict[str, Resource]) -> str:
    """The fleet a run goes to: the first it names, else the first declared, else `local`."""
    spec = resource.spec
    assert isinstance(spec, RunSpec)
    named = spec.placement_fleets()
    if named:
        return named[0]
    return next(iter(fleets), LOCAL_FLEET)


def placeable(fleet: str, provider: str, items: Mapping[str, DesiredItem], state: State) -> bool:
    """Whether the plan can place runs on `fleet`: the local fleet, or an SSH (or engine)
    fleet that state records as this plan leaves it (one it creates or changes is known
    after apply), or another project's fleet (its owner's apply changes it, not this plan)."""
    if fleet == LOCAL_FLEET or is_imported(fleet):
        return True
    address = f"fleet.{fleet}"
    current, item = state.get(address), items.get(address)
    known = provider in HOST_FLEET_PROVIDERS or provider in ENGINES
    if not known or current is None or current.tainted or item is None:
        return False
    return not diff_specs("fleet", current.spec, item.spec).changed
