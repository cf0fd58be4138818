"""How many replicas a service with `scaling` has: the count watch's autoscaler chose
(`watch/autoscale.py`), kept in the run's state attributes under `scaling`, so an apply
that updates the service (a new `scaling.target`, a wider range) keeps the replicas load
asked for instead of falling back to the minimum. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from dstack_plan.config.runs import ServiceSpec
from dstack_plan.runs.jobs import initial_replicas
from dstack_plan.state.model import ResourceState

SCALING_KEY = "scaling"


class ScalingRecord(BaseModel):
    """What the autoscaler decided for a service, as its state attributes keep it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    desired: int
    """The replicas the service should have now."""
    wanted: int
    """What the request rate alone asks for (before scale_up_delay / scale_down_delay)."""
    rps: float
    """Requests per second over `scaling.window` when `desired` or `wanted` last changed
    (the record is rewritten only then, not each tick)."""
    scaled_at: float
    """When `desired` last changed (epoch seconds); the delays count from here."""
    held_by: str | None = None
    """What keeps `desired` from `wanted` (`scale_up_delay`, `scale_down_delay`, `window`)."""
    held_until: float | None = None
    """When that ends (epoch seconds)."""

    @classmethod
    def of(cls, attributes: Mapping[str, Any]) -> ScalingRecord | None:
        value = attributes.get(SCALING_KEY)
        return cls.model_validate(value) if isinstance(value, dict) else None


def autoscaled(spec: ServiceSpec) -> bool:
    """Whether watch scales this service by its request rate: `scaling` on a service
    without replica groups (groups keep their minimum)."""
    return spec.scaling is not None and not spec.replica_groups()


def replica_range(spec: ServiceSpec) -> tuple[int, int]:
    """(min, max) replicas of a service without replica groups."""
    replicas = spec.replicas
    assert not isinstance(replicas, tuple)  # replica groups have no single range
    low = replicas.min or 0
    return low, replicas.max if replicas.max is not None else low


def kept_replicas(spec: ServiceSpec, attributes: Mapping[str, Any]) -> int:
    """The replicas an update of the service keeps: the autoscaler's count, within the
    (possibly new) range, for an autoscaled service; else what the spec starts with."""
    record = ScalingRecord.of(attributes) if autoscaled(spec) else None
    if record is None:
        return initial_replicas(spec)
    low, high = replica_range(spec)
    return min(max(record.desired, low), high)


def scaled_to_zero(entry: ResourceState) -> bool:
    """Whether service `entry` has no replica because the autoscaler scaled it to zero (it
    is running: the next request starts one), not because its jobs are gone."""
    record = ScalingRecord.of(entry.attributes) if entry.kind == "service" else None
    return record is not None and record.desired == 0
