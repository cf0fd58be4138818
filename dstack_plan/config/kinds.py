"""The configuration kinds, keyed by their `type:` value: the six resource kinds and presets.

Fleets, volumes, gateways and presets are imported when a project first uses one: a project of
runs alone never builds their models (a few milliseconds of every `dstack` start-up).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dstack_plan.config.base import KINDS, RESOURCE_KINDS  # noqa: F401 - they belong here too

if TYPE_CHECKING:
    from dstack_plan.config.fleet import FleetSpec
    from dstack_plan.config.gateway import GatewaySpec
    from dstack_plan.config.preset import PresetSpec
    from dstack_plan.config.runs import DevEnvironmentSpec, ServiceSpec, TaskSpec
    from dstack_plan.config.volume import VolumeSpec

    AnySpec = TaskSpec | ServiceSpec | DevEnvironmentSpec | FleetSpec | VolumeSpec | GatewaySpec
    AnyConfig = AnySpec | PresetSpec

# kind -> (module in dstack_plan.config, class); the same order as KINDS
_CLASS_BY_KIND = {
    "task": ("runs", "TaskSpec"),
    "service": ("runs", "ServiceSpec"),
    "dev-environment": ("runs", "DevEnvironmentSpec"),
    "fleet": ("fleet", "FleetSpec"),
    "volume": ("volume", "VolumeSpec"),
    "gateway": ("gateway", "GatewaySpec"),
    "preset": ("preset", "PresetSpec"),
}

RUN_KINDS = frozenset({"task", "service", "dev-environment"})
CONFIG_ONLY_KINDS = frozenset(KINDS) - frozenset(RESOURCE_KINDS)
"""Kinds that are loaded and checked but are no resources: never planned (presets)."""


def spec_class(kind: str) -> type[AnySpec]:
    """The model of configuration kind `kind` (a `type:` value); KeyError for no such kind."""
    module, name = _CLASS_BY_KIND[kind]
    return getattr(importlib.import_module(f"dstack_plan.config.{module}"), name)
