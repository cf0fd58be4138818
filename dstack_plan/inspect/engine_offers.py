"""`dstack offer` on engine fleets: a row per partition of each Slurm fleet, per node group of
each Kubernetes fleet.

A row is what one node of the partition or group has (the smallest, as a run is matched) and
how many of its nodes are up now, read from the cluster: `scontrol show node` through the
login node (one command per cluster), the API server's node list. It is never a price: the
cluster is the team's. Its availability is `idle` while a Slurm node is idle, `available`
while a node is up (the engine queues the run), `not_available` when none is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.records import is_engine_fleet
from dstack_plan.inspect.offer_rows import Availability, OfferRow, Unmatched, row_resources
from dstack_plan.providers.base import MachineResources
from dstack_plan.state.model import State

if TYPE_CHECKING:
    from dstack_plan.project import Project


def engine_fleets(state: State, backend: str | None = None) -> list[str]:
    """The engine fleets in state (only `backend`'s when given; tainted ones left out:
    being replaced)."""
    return [
        entry.name
        for entry in state.resources.values()
        if is_engine_fleet(entry)
        and not entry.tainted
        and (backend is None or entry.provider == backend)
    ]


@dataclass(frozen=True)
class Capacity:
    """One partition or node group as a row sees it."""

    name: str
    resources: MachineResources
    mismatch: str | None
    nodes: int
    up: int
    idle: int | None
    """Nodes with nothing running; None where the engine does not say."""


async def engine_rows(
    project: Project, state: State, requirements: ResourcesSpec, backend: str | None = None
) -> tuple[list[OfferRow], list[Unmatched]]:
    """A row per partition or node group of every engine fleet (only `backend`'s when given)
    that matches `requirements`; the others, and clusters that did not answer, unmatched
    with why."""
    rows: list[OfferRow] = []
    unmatched: list[Unmatched] = []
    for fleet in engine_fleets(state, backend):
        entry = state.resources[f"fleet.{fleet}"]
        engine = project.machines.engine(fleet, state)
        try:
            cluster, found = await _capacity(entry.provider, engine, requirements)
        except DstackPlanError as e:
            unmatched.append(Unmatched(fleet=fleet, host=engine.name, reason=str(e)))
            continue
        for capacity in found:
            host = f"{cluster}/{capacity.name}"
            if capacity.mismatch is not None:
                unmatched.append(Unmatched(fleet=fleet, host=host, reason=capacity.mismatch))
                continue
            fields = row_resources(capacity.resources) | {"disk_gb": 0.0}  # not the engine's
            said = (
                f"{capacity.idle} of {capacity.nodes} nodes idle"
                if capacity.idle is not None
                else f"{capacity.up} of {capacity.nodes} nodes ready"
            )
            rows.append(
                OfferRow(
                    fleet=fleet,
                    provider=entry.provider,
                    host=f"{host} ({said})",
                    region=cluster,
                    price_per_hour=0.0,
                    availability=_availability(capacity),
                    free_gpus=None,  # per node, not known: the engine places the run
                    held_by=(),
                    **fields,
                )
            )
    return rows, unmatched


async def _capacity(
    provider: str, engine: object, requirements: ResourcesSpec
) -> tuple[str, list[Capacity]]:
    """The cluster's name and its partitions or node groups, as they are now."""
    if provider == "slurm":
        from dstack_plan.providers.slurm.engine import SlurmEngine
        from dstack_plan.providers.slurm.request import node_resources, partition_mismatch

        assert isinstance(engine, SlurmEngine)
        return engine.cluster.name, [
            Capacity(
                name=p.name,
                resources=node_resources(p),
                mismatch=partition_mismatch(requirements, p),
                nodes=p.nodes,
                up=p.usable,
                idle=p.idle,
            )
            for p in await engine.partitions()
        ]
    from dstack_plan.providers.kubernetes.engine import KubernetesEngine
    from dstack_plan.providers.kubernetes.nodes import group_mismatch
    from dstack_plan.providers.kubernetes.nodes import node_resources as group_resources

    assert isinstance(engine, KubernetesEngine)
    return engine.cluster.name, [
        Capacity(
            name=g.name,
            resources=group_resources(g),
            mismatch=group_mismatch(requirements, g),
            nodes=g.nodes,
            up=g.ready,
            idle=None,
        )
        for g in await engine.node_groups()
    ]


def _availability(capacity: Capacity) -> Availability:
    if capacity.idle:
        return "idle"
    return "available" if capacity.up else "not_available"
