"""The six configuration kinds, keyed by their `type:` value."""

from __future__ import annotations

from dstack_plan.config.fleet import FleetSpec
from dstack_plan.config.gateway import GatewaySpec
from dstack_plan.config.runs import DevEnvironmentSpec, ServiceSpec, TaskSpec
from dstack_plan.config.volume import VolumeSpec

AnySpec = TaskSpec | ServiceSpec | DevEnvironmentSpec | FleetSpec | VolumeSpec | GatewaySpec

SPEC_BY_KIND: dict[str, type[AnySpec]] = {
    "task": TaskSpec,
    "service": ServiceSpec,
    "dev-environment": DevEnvironmentSpec,
    "fleet": FleetSpec,
    "volume": VolumeSpec,
    "gateway": GatewaySpec,
}

RUN_KINDS = frozenset({"task", "service", "dev-environment"})
