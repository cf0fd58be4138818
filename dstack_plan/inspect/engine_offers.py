"""`dstack offer` on Slurm fleets: each partition a run may use, as one row per partition.

A partition's row is what one of its nodes has (the smallest, as a run is matched) and how
many of its nodes are up and idle now, read from the cluster through its login node
(`scontrol show node`, one command per cluster). A partition is never a price: the cluster
is the team's. Its availability is `idle` while a node is idle, `available` while one is up
(Slurm queues the run), `not_available` when none is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.records import is_engine_fleet
from dstack_plan.inspect.offer_rows import Availability, OfferRow, Unmatched, row_resources
from dstack_plan.providers.slurm.partitions import Partition
from dstack_plan.providers.slurm.request import node_resources, partition_mismatch
from dstack_plan.state.model import State

if TYPE_CHECKING:
    from dstack_plan.project import Project


def slurm_fleets(state: State) -> list[str]:
    """The Slurm fleets in state (tainted ones left out: being replaced)."""
    return [
        entry.name
        for entry in state.resources.values()
        if is_engine_fleet(entry) and not entry.tainted
    ]


async def slurm_rows(
    project: Project, state: State, requirements: ResourcesSpec
) -> tuple[list[OfferRow], list[Unmatched]]:
    """A row per partition of every Slurm fleet that matches `requirements`; the others,
    and the clusters that did not answer, unmatched with why."""
    rows: list[OfferRow] = []
    unmatched: list[Unmatched] = []
    for fleet in slurm_fleets(state):
        engine = project.machines.engine(fleet, state)
        try:
            partitions = await engine.partitions()
        except DstackPlanError as e:
            unmatched.append(Unmatched(fleet=fleet, host=engine.cluster.name, reason=str(e)))
            continue
        for partition in partitions:
            host = f"{engine.cluster.name}/{partition.name}"
            resources = node_resources(partition)
            why = partition_mismatch(requirements, partition)
            if why is not None:
                unmatched.append(Unmatched(fleet=fleet, host=host, reason=why))
                continue
            fields = row_resources(resources) | {"disk_gb": 0.0}  # not Slurm's to grant
            rows.append(
                OfferRow(
                    fleet=fleet,
                    provider="slurm",
                    host=f"{host} ({partition.idle} of {partition.nodes} nodes idle)",
                    region=engine.cluster.name,
                    price_per_hour=0.0,
                    availability=_availability(partition),
                    free_gpus=None,  # per node, not known: the idle nodes say it
                    held_by=(),
                    **fields,
                )
            )
    return rows, unmatched


def _availability(partition: Partition) -> Availability:
    if partition.idle:
        return "idle"
    return "available" if partition.usable else "not_available"
