"""Choosing machines for a run's jobs. Pure: the caller gathers candidates, we decide."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.providers.base import MachineResources
from dstack_plan.scheduler.matching import gpus_wanted, mismatch


class Candidate(NamedTuple):
    """A machine a run may use."""

    fleet: str
    provider: str
    host: str
    resources: MachineResources
    free_gpus: int
    price_per_hour: float = 0.0


class Decision(NamedTuple):
    hosts: tuple[Candidate, ...] = ()
    """One machine per job, in job order; empty when the run cannot be placed."""
    reason: str | None = None

    @property
    def placed(self) -> bool:
        return bool(self.hosts)

    @property
    def price_per_hour(self) -> float:
        return sum({c.host: c.price_per_hour for c in self.hosts}.values())


def place(
    requirements: ResourcesSpec, jobs: int, candidates: Sequence[Candidate], distinct: bool
) -> Decision:
    """Pick a machine for each of `jobs` jobs, first fit in candidate order.

    `distinct`: multi-node jobs each need their own machine; replicas may share one.
    """
    if not candidates:
        return Decision(reason="no machines in the eligible fleets")
    wanted_gpus = gpus_wanted(requirements.gpu)
    free = {c.host: c.free_gpus for c in candidates}
    chosen: list[Candidate] = []
    reasons: list[str] = []
    for _ in range(jobs):
        pick = None
        for candidate in candidates:
            if distinct and candidate in chosen:
                continue
            why = mismatch(requirements, candidate.resources, free[candidate.host])
            if why is None:
                pick = candidate
                break
            reasons.append(f"{candidate.fleet}/{candidate.host}: {why}")
        if pick is None:
            detail = "; ".join(dict.fromkeys(reasons)) or "not enough machines"
            if distinct and jobs > len(candidates):
                detail = f"needs {jobs} machines, eligible fleets have {len(candidates)}"
            return Decision(reason=detail)
        free[pick.host] -= wanted_gpus
        chosen.append(pick)
    return Decision(hosts=tuple(chosen))
