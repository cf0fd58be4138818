"""The six configuration kinds, keyed by their `type:` value.

Fleets, volumes and gateways are imported when a project first uses one: a project of runs alone
never builds their models (a few milliseconds of every `dstack` start-up).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dstack_plan.config.base import KINDS  # noqa: F401 - the kinds, in order, belong here too

if TYPE_CHECKING:
    from dstack_plan.config.fleet import FleetSpec
    from dstack_plan.config.gateway import GatewaySpec
    from dstack_plan.config.runs import DevEnvironmentSpec, ServiceSpec, TaskSpec
    from dstack_plan.config.volume import VolumeSpec

    AnySpec = TaskSpec | ServiceSpec | DevEnvironmentSpec | FleetSpec | VolumeSpec | GatewaySpec

# kind -> (module in dstack_plan.config, class); the same order as KINDS
_CLASS_BY_KIND = {
    "task": ("runs", "TaskSpec"),
    "service": ("runs", "ServiceSpec"),
    "dev-environment": ("runs", "DevEnvironmentSpec"),
    "fleet": ("fleet", "FleetSpec"),
    "volume": ("volume", "VolumeSpec"),
    "gateway": ("gateway", "GatewaySpec"),
}

RUN_KINDS = frozenset({"task", "service", "dev-environment"})


def spec_class(kind: str) -> type[AnySpec]:
    """The model of configuration kind `kind` (a `type:` value); KeyError for no such kind."""
    module, name = _CLASS_BY_KIND[kind]
    return getattr(importlib.import_module(f"dstack_plan.config.{module}"), name)
