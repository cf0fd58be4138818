"""Checks dstack makes in its server, not in its parser: made here when a plan is computed.

A file with these problems loads (dstack's parser accepts it), but `plan` and `validate`
refuse it, each problem located at the offending key as a load error would be:

- fleets: `nodes` (cloud) or `ssh_config` (SSH), not neither, not both; the fields only one
  kind takes; SSH hosts with a user, listed once (by hostname and port) in one fleet of the
  project (`host_checks.py`), with `internal_ip` on all or none of them (and not together
  with `network`);
- runs: an `image` and a `user` the agent accepts (a reference without shell or control
  characters; user[:group]);
- gateways: at most 3 `replicas`, and more than one only without a Let's Encrypt certificate;
- references to another project's gateway, or to its fleet in an instance selector (a run's
  `fleets: [team/gpu]` resolves at plan time: `sharing/imports.py`);
- `${{ groups[i].nodes[j].IP_ADDRESS }}` (tasks) and `groups[i].replicas[j]` (services): in
  commands only, the member the run's kind has, within the group sizes.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dstack_plan.agent.image_ref import image_reference_error
from dstack_plan.agent.protocol import USER_PATTERN
from dstack_plan.config.interpolation import GroupAddress, group_addresses
from dstack_plan.config.loader import issue_at
from dstack_plan.config.profile import InstanceRef, reference_parts
from dstack_plan.config.resource import STATE_SOURCE, Desired, Resource
from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec, ServiceSpec, TaskSpec
from dstack_plan.errors import ConfigError, ConfigIssue
from dstack_plan.graph.references import dependencies
from dstack_plan.plan.host_checks import local_fact_issues, shared_host_issues
from dstack_plan.providers.names import ENGINES, KUBERNETES, SLURM

if TYPE_CHECKING:  # imported when a project declares one (they load on first use)
    from dstack_plan.config.fleet import FleetSpec, SSHConfig
    from dstack_plan.config.gateway import GatewaySpec

KeyPath = tuple[str | int, ...]
Found = tuple[KeyPath, str]
"""A problem: where in the resource's document (at the key), and the message."""

MAX_GATEWAY_REPLICAS = 3
"""dstack's server default (`DSTACK_SERVER_GATEWAY_MAX_REPLICAS`)."""
_CLOUD_ONLY = ("resources", "backends", "regions", "instance_types")
_USER = re.compile(USER_PATTERN)


def checked_dependencies(
    desired: Desired,
    project_dir: str | Path = ".",
    *,
    local_facts: bool = False,
    unresolved: list[ConfigIssue] | None = None,
    known: Container[str] = (),
) -> dict[str, tuple[str, ...]]:
    """`graph.references.dependencies`, plus the limits above: every problem of both at once,
    as one ConfigError. What `plan` and `validate` check without state; with `local_facts`
    (`plan`, not `validate`), also what only this machine can tell: that the SSH fleets' key
    files can be read (`host_checks.local_fact_issues`). `unresolved` and `known`: see
    `dependencies`."""
    issues = limit_issues(desired, project_dir)
    if local_facts:
        issues += local_fact_issues(desired, project_dir)
    try:
        edges = dependencies(desired, project_dir, unresolved=unresolved, known=known)
    except ConfigError as e:
        raise ConfigError([*e.issues, *issues]) from None
    if issues:
        raise ConfigError(issues)
    return edges


def limit_issues(desired: Desired, project_dir: str | Path = ".") -> list[ConfigIssue]:
    """Every limit problem of every declared resource, located."""
    issues = []
    for resource in desired:
        if resource.source.file == STATE_SOURCE:  # a submission's context: checked when applied
            continue
        # a gateway's problem is a value (`replicas: 4`): pointed at as a load error would be
        target: Literal["key", "value"] = "value" if resource.kind == "gateway" else "key"
        for path, message in _problems(resource):
            issues.append(issue_at(resource, path, message, project_dir, target))
    return issues + shared_host_issues(desired, project_dir)


def _problems(resource: Resource) -> Iterator[Found]:
    spec = resource.spec
    if resource.kind == "fleet":
        yield from _fleet(spec)  # type: ignore[arg-type]
    elif resource.kind == "gateway":
        yield from _gateway(spec)  # type: ignore[arg-type]
    elif isinstance(spec, RunSpec):
        yield from _job_fields(spec)
        yield from _other_projects(spec)
        if resource.may_reference:  # no `${{` anywhere in its file: no group references
            yield from _group_references(spec)


def _fleet(spec: FleetSpec) -> Iterator[Found]:
    ssh = spec.ssh_config
    engines = [b for b in spec.backends or () if b in ENGINES]
    if ssh is None and engines:
        yield from _engine_fleet(spec, engines[0])
        return
    if ssh is None:
        if spec.nodes is None:
            yield (), "a fleet needs 'nodes' (cloud fleet) or 'ssh_config' (SSH fleet)"
        if spec.env:
            yield ("env",), "'env' is only for SSH fleets"
        return
    cloud_only = [f for f in ("nodes", *_CLOUD_ONLY) if getattr(spec, f) is not None]
    if cloud_only:
        yield (cloud_only[0],), f"SSH fleets do not take {', '.join(cloud_only)}"
    yield from _hosts(ssh)


_ENGINE_CAPACITY = {
    SLURM: ("Slurm", "partitions (gpu_partitions, cpu_partitions in .dstack/backends.yml)"),
    KUBERNETES: ("Kubernetes", "nodes, as its scheduler places the pods"),
}


def _engine_fleet(spec: FleetSpec, engine: str) -> Iterator[Found]:
    """A Slurm or Kubernetes fleet is capacity on a cluster: its nodes are the cluster's
    (docs/slurm.md, docs/kubernetes.md)."""
    title, capacity = _ENGINE_CAPACITY[engine]
    if spec.backends != (engine,):
        yield ("backends",), f"a {title} fleet has one backend: backends: [{engine}]"
    if spec.nodes is not None:
        yield (
            ("nodes",),
            f"a {title} fleet creates no nodes: runs go to the cluster's {capacity}; drop 'nodes'",
        )
    if spec.env:
        yield ("env",), "'env' is only for SSH fleets"


def _hosts(ssh: SSHConfig) -> Iterator[Found]:
    seen: dict[tuple[str, int], int] = {}  # (hostname, port) -> index of its first entry
    for index, host in enumerate(ssh.hosts):
        where = ("ssh_config", "hosts", index)
        if not (host.user or ssh.user):
            yield where, f"host {host.hostname}: no user (set ssh_config.user or the host's)"
        endpoint = ssh.endpoint(host)
        if endpoint in seen:
            name, port = endpoint
            first = f"ssh_config.hosts[{seen[endpoint]}]"
            yield where, f"host {name} port {port} is listed twice (first as {first})"
        seen.setdefault(endpoint, index)
    with_ip = [h.internal_ip is not None for h in ssh.hosts]
    if any(with_ip) and not all(with_ip):
        yield ("ssh_config", "hosts"), "internal_ip must be set on all hosts or on none"
    if any(with_ip) and ssh.network:
        yield ("ssh_config", "network"), "'internal_ip' and 'network' are mutually exclusive"


def _gateway(spec: GatewaySpec) -> Iterator[Found]:
    from dstack_plan.config.gateway import LetsEncrypt  # noqa: PLC0415 - only when declared

    if spec.replicas > MAX_GATEWAY_REPLICAS:
        yield (
            ("replicas",),
            f"a gateway has at most {MAX_GATEWAY_REPLICAS} replicas, got {spec.replicas}",
        )
    elif spec.replicas > 1 and isinstance(spec.certificate, LetsEncrypt):
        yield (
            ("replicas",),
            "a gateway with more than one replica cannot use a lets-encrypt certificate: set "
            "'certificate' to null (no HTTPS) or {type: acm, arn} (AWS)",
        )


def _job_fields(spec: RunSpec) -> Iterator[Found]:
    """What the agent would refuse of the run's jobs, refused where it is written instead:
    the image reference (no shell or control characters) and the user."""
    # `${{ env.X }}` and the like are resolved at apply time: the agent checks what comes out
    if spec.image is not None and "${{" not in spec.image:
        why = image_reference_error(spec.image)
        if why is not None:
            yield ("image",), f"image {spec.image!r} {why}"
    if spec.user is not None and "${{" not in spec.user and not _USER.fullmatch(spec.user):
        yield ("user",), f"user {spec.user!r}: expected user[:group] of names or numeric ids"


def _other_projects(spec: RunSpec) -> Iterator[Found]:
    # another project's fleet (`fleets: [team/gpu]`) resolves when the plan places the run
    # (`sharing/imports.py`), its gateway when the plan is checked (`gateways/served.py`);
    # an instance selector of one has nothing to select from yet
    why = "references to other projects are not supported here yet"
    for index, selector in enumerate(spec.instances or ()):
        if isinstance(selector, InstanceRef) and selector.fleet is not None:
            project, name = reference_parts(selector.fleet)
            if project is not None:
                path = ("instances", index, "fleet")
                use = f"use fleets: [{project}/{name}]"
                yield path, f"fleet {name!r} of project {project!r}: {why} ({use})"


def address_groups(spec: RunSpec) -> tuple[str, list[int]]:
    """The member group references of this run use (`nodes` or `replicas`) and the size of
    each group: a task's node groups (one group of all its nodes without `groups`), a
    service's replica groups (their minimum replicas, as dstack counts them), one node for
    a dev environment."""
    if isinstance(spec, ServiceSpec):
        groups = spec.replica_groups()
        if groups:
            counts = [g.replicas or g.count for g in groups]
            return "replicas", [(c.min or 0) if c is not None else 1 for c in counts]
        replicas = spec.replicas
        assert not isinstance(replicas, tuple)  # a tuple is replica groups, handled above
        return "replicas", [replicas.min or 0]
    if isinstance(spec, TaskSpec):
        if spec.groups:
            return "nodes", [g.nodes for g in spec.groups]
        return "nodes", [spec.node_count()]
    return "nodes", [1]


def _commands(spec: RunSpec) -> Iterator[tuple[KeyPath, str]]:
    """Every command of the run with its path, where dstack allows group references."""
    for index, command in enumerate(getattr(spec, "commands", None) or ()):
        yield ("commands", index), command
    if isinstance(spec, DevEnvironmentSpec):
        for index, command in enumerate(spec.init):
            yield ("init", index), command
    groups_key = "groups"
    groups: tuple[object, ...] = ()
    if isinstance(spec, TaskSpec):
        groups = spec.groups or ()
    elif isinstance(spec, ServiceSpec):
        groups = spec.replica_groups()
        groups_key = "replicas" if isinstance(spec.replicas, tuple) else "groups"
    for number, group in enumerate(groups):
        for index, command in enumerate(getattr(group, "commands", None) or ()):
            yield (groups_key, number, "commands", index), command


def _group_references(spec: RunSpec) -> Iterator[Found]:
    for key, value in spec.env.items():
        if value is not None and group_addresses(value):
            yield ("env", key), f"env {key}: groups IP references are only for commands"
    member, sizes = address_groups(spec)
    kind = "a service" if isinstance(spec, ServiceSpec) else "a task"
    for path, command in _commands(spec):
        for ref in group_addresses(command):
            problem = _group_reference_problem(ref, member, sizes, kind)
            if problem:
                yield path, f"{ref}: {problem}"


def _group_reference_problem(ref: GroupAddress, member: str, sizes: list[int], kind: str) -> str:
    if ref.member != member:
        return f"{kind}'s commands refer to groups[N].{member}[M], not {ref.member}"
    if ref.group >= len(sizes):
        count = len(sizes)
        return f"out of range: there {'is' if count == 1 else 'are'} {count} group(s)"
    if ref.slot >= sizes[ref.group]:
        if member == "replicas" and sizes[ref.group] == 0:
            return "this group scales to zero, so no replica is guaranteed at start"
        size = sizes[ref.group]
        return f"out of range: group {ref.group} has {size} {member if size != 1 else member[:-1]}"
    return ""
