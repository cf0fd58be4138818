"""Which resources a declared resource depends on (the edges of the DAG)."""

from __future__ import annotations

from pathlib import Path

from dstack_plan.config.loader import issue_at
from dstack_plan.config.resource import Desired
from dstack_plan.config.run_fields import NetworkVolumeMount
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.errors import ConfigError, ConfigIssue


def dependencies(desired: Desired, project_dir: str | Path = ".") -> dict[str, tuple[str, ...]]:
    """address -> addresses it depends on, for every declared resource.

    A run depends on the fleets it names in `fleets:` (all declared fleets when it names none),
    on the network volumes it mounts, and a service on its gateway; `depends_on` adds more.
    A reference to something not declared is a ConfigError at the resource.
    """
    fleets = [r.name for r in desired.of_kind("fleet")]
    default_gateway = _default_gateway(desired)
    edges: dict[str, tuple[str, ...]] = {}
    issues: list[ConfigIssue] = []
    for resource in desired:
        wanted: dict[str, str] = {}  # address -> the key that refers to it
        spec = resource.spec
        if isinstance(spec, RunSpec):
            named = spec.fleet_names()
            wanted |= {f"fleet.{n}": "fleets" for n in (fleets if named is None else named)}
            wanted |= {f"volume.{n}": "volumes" for n in _mounted_volume_names(spec)}
        if isinstance(spec, ServiceSpec):
            gateway = _gateway_of(spec, default_gateway)
            if gateway:
                wanted[f"gateway.{gateway}"] = "gateway"
        wanted |= {address: "depends_on" for address in spec.depends_on}
        for address, key in wanted.items():
            if address not in desired.resources:
                message = f"{resource.address} refers to {address}, which is not declared"
                issues.append(issue_at(resource, (key,), message, project_dir))
        edges[resource.address] = tuple(a for a in wanted if a in desired.resources)
    if issues:
        raise ConfigError(issues)
    return edges


def _mounted_volume_names(spec: RunSpec) -> list[str]:
    names: list[str] = []
    for mount in spec.volumes:
        if isinstance(mount, NetworkVolumeMount):
            candidates = (mount.name,) if isinstance(mount.name, str) else mount.name
            # per-node names such as data-${{ dstack.node_rank }} are resolved per job later
            names += [n for n in candidates if "${{" not in n]
    return names


def _default_gateway(desired: Desired) -> str | None:
    declared = desired.of_kind("gateway")
    if not declared:
        return None
    from dstack_plan.config.gateway import GatewaySpec  # noqa: PLC0415 - only when declared

    gateways = [r for r in declared if isinstance(r.spec, GatewaySpec)]
    defaults = [r.name for r in gateways if r.spec.default]
    return defaults[0] if defaults else None


def _gateway_of(spec: ServiceSpec, default: str | None) -> str | None:
    if spec.gateway is False:
        return None
    if spec.gateway is None or spec.gateway is True:
        return default
    return spec.gateway
