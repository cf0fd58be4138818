"""Which resources a declared resource depends on (the edges of the DAG), checked.

`plan`, `graph` and `validate` all take their edges from `dependencies`, so they agree on
what is wrong: a reference to something not declared, or a dependency cycle.
"""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path

from dstack_plan.config.loader import issue_at
from dstack_plan.config.profile import reference_parts
from dstack_plan.config.resource import STATE_SOURCE, Desired, Resource
from dstack_plan.config.run_fields import NetworkVolumeMount
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.errors import ConfigError, ConfigIssue
from dstack_plan.graph.cycles import find_cycles, starting_at

KeyPath = tuple[str | int, ...]


def dependencies(
    desired: Desired,
    project_dir: str | Path = ".",
    *,
    unresolved: list[ConfigIssue] | None = None,
    known: Container[str] = (),
) -> dict[str, tuple[str, ...]]:
    """address -> addresses it depends on, for every declared resource.

    A run depends on the fleets it names in `fleets:` (all declared fleets when it names none),
    on the network volumes it mounts, a service on its gateway, and a gateway on an SSH host on
    that host's fleet; `depends_on` adds more.
    A reference to something not declared, and a dependency cycle, are ConfigErrors located at
    the referring key; all of them are reported at once. `validate -f` of files without their
    project gives `unresolved`: references to what neither the files nor `known` (the
    project's state) hold go there, as warnings, instead of failing.
    """
    fleets = [r.name for r in desired.of_kind("fleet")]
    default_gateway = _default_gateway(desired)
    edges: dict[str, tuple[str, ...]] = {}
    issues: list[ConfigIssue] = []
    for resource in desired:
        wanted = _references(resource, fleets, default_gateway)
        for address, key in wanted.items():
            if address not in desired.resources and resource.source.file != STATE_SOURCE:
                if unresolved is None:
                    message = (
                        f"{resource.address} refers to {address}, which is {_missing(desired)}"
                    )
                    issues.append(issue_at(resource, (key,), message, project_dir))
                elif address not in known:
                    message = (
                        f"{resource.address} refers to {address}, which neither the files nor "
                        "the project's state hold: plan resolves it where the run is applied"
                    )
                    unresolved.append(issue_at(resource, (key,), message, project_dir))
        edges[resource.address] = tuple(a for a in wanted if a in desired.resources)
    # only `depends_on` can close a loop: implied edges point from runs to what they use
    if any(r.spec.depends_on for r in desired):
        issues += _cycle_issues(desired, edges, fleets, default_gateway, project_dir)
    if issues:
        raise ConfigError(issues)
    return edges


def _missing(desired: Desired) -> str:
    if desired.submission:  # it may also refer to what the project's state holds
        return "neither in the files given nor in the project's state (apply it first)"
    return "not declared"


def _references(
    resource: Resource, fleets: list[str], default_gateway: str | None
) -> dict[str, str]:
    """address -> the key of `resource` that refers to it."""
    wanted: dict[str, str] = {}
    spec = resource.spec
    if isinstance(spec, RunSpec):
        named = spec.fleet_names()
        wanted |= {f"fleet.{n}": "fleets" for n in (fleets if named is None else named)}
        wanted |= {f"volume.{n}": "volumes" for _, n in _mounted_volume_names(spec)}
    if isinstance(spec, ServiceSpec):
        gateway = gateway_of(spec, default_gateway)
        if gateway:
            wanted[f"gateway.{gateway}"] = "gateway"
    if resource.kind == "gateway":  # on an SSH host: on the fleet that has the host
        fleet = getattr(spec, "fleet", None)
        if isinstance(fleet, str):
            wanted[f"fleet.{fleet}"] = "fleet"
    wanted |= {address: "depends_on" for address in spec.depends_on}
    return wanted


def _cycle_issues(
    desired: Desired,
    edges: dict[str, tuple[str, ...]],
    fleets: list[str],
    default_gateway: str | None,
    project_dir: str | Path,
) -> list[ConfigIssue]:
    order = {address: index for index, address in enumerate(desired.resources)}
    issues = []
    for cycle in find_cycles(edges):
        # read it from the resource declared first, and point at the key that leaves it
        cycle = starting_at(cycle, min(cycle[:-1], key=order.__getitem__))
        resource = desired.resources[cycle[0]]
        key = _references(resource, fleets, default_gateway)[cycle[1]]
        message = "dependency cycle: " + " -> ".join(cycle)
        path = _item_path(resource, key, cycle[1])
        issues.append(issue_at(resource, path, message, project_dir))
    return issues


def _item_path(resource: Resource, key: str, address: str) -> KeyPath:
    """The list item under `key` that names `address` (the key itself for implied edges)."""
    spec = resource.spec
    if key == "depends_on":
        return (key, spec.depends_on.index(address))
    if key == "volumes" and isinstance(spec, RunSpec):
        name = address.removeprefix("volume.")
        return (key, next(i for i, n in _mounted_volume_names(spec) if n == name))
    if key == "fleets" and isinstance(spec, RunSpec):
        named = spec.fleet_names()
        name = address.removeprefix("fleet.")
        return (key,) if named is None else (key, named.index(name))
    return (key,)


def _mounted_volume_names(spec: RunSpec) -> list[tuple[int, str]]:
    names: list[tuple[int, str]] = []
    for index, mount in enumerate(spec.volumes):
        if isinstance(mount, NetworkVolumeMount):
            candidates = (mount.name,) if isinstance(mount.name, str) else mount.name
            # per-node names such as data-${{ dstack.node_rank }} are resolved per job later
            names += [(index, n) for n in candidates if "${{" not in n]
    return names


def _default_gateway(desired: Desired) -> str | None:
    declared = desired.of_kind("gateway")
    if not declared:
        return None
    from dstack_plan.config.gateway import GatewaySpec  # noqa: PLC0415 - only when declared

    defaults = [r.name for r in declared if isinstance(r.spec, GatewaySpec) and r.spec.default]
    return defaults[0] if defaults else None


def gateway_of(spec: ServiceSpec, default: str | None) -> str | None:
    """The name of the gateway service `spec` is served by (`default`: the project's default
    gateway, if any), or None."""
    if spec.gateway is False:
        return None
    if spec.gateway is None or spec.gateway is True:
        return default
    project, name = reference_parts(spec.gateway)
    # another project's gateway is no edge: the plan refuses it (plan/limits.py)
    return name if project is None else None
