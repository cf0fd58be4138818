"""The rows of `dstack offer` (`--json` prints these models), apart from how they are found
(`inspect/offers.py`, `inspect/engine_offers.py`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from dstack_plan.providers.base import MachineResources

Availability = Literal[
    "idle", "available", "busy", "unreachable", "not_available", "no_quota", "unknown"
]


class GPUInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    memory_mib: int


class OfferRow(BaseModel):
    """A machine that matches (`--json` prints these under `offers`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str | None
    """The fleet the host is in; None for a provider's offer (a machine not created yet)."""
    provider: str
    host: str
    """The host's name in its fleet, or the offer's instance type."""
    region: str
    cpus: int
    memory_gb: float
    disk_gb: float
    gpus: tuple[GPUInfo, ...]
    price_per_hour: float
    availability: Availability
    free_gpus: int | None
    """GPUs no job holds now; None when not known (the host did not answer, an offer)."""
    held_by: tuple[str, ...]
    """What runs there now (`task.train`, `x (another project)`), oldest first."""
    error: str | None = None
    """Why the host's jobs are not known (unreachable, agent down)."""


class Unmatched(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str | None
    host: str
    reason: str


class OfferView(BaseModel):
    """`dstack offer --json`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requirements: str
    """What was asked for, as `cpu=2.. mem=8GB.. disk=100GB.. gpu=A100:2`."""
    offers: tuple[OfferRow, ...]
    """Available first, then cheapest; ties in fleet and host order."""
    unmatched: tuple[Unmatched, ...]
    notes: tuple[str, ...]
    """Providers that could not be asked, and that no cloud offers exist."""


def row_resources(resources: MachineResources) -> dict[str, Any]:
    """A row's resource fields (cpus, memory, disk, GPUs) from what one machine has."""
    return {
        "cpus": resources.cpus,
        "memory_gb": resources.memory_gb,
        "disk_gb": resources.disk_gb,
        "gpus": tuple(GPUInfo(name=g.name, memory_mib=g.memory_mib) for g in resources.gpus),
    }
