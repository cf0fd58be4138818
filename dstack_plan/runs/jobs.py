"""Turning a run's spec into the jobs its agents execute: one per node or replica."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from pydantic import SecretStr

from dstack_plan.agent.api_models import (
    DiskMount,
    JobSpec,
    PortMapping,
    RegistryCredentials,
    SSHAccess,
    VolumeMount,
)
from dstack_plan.config import interpolation
from dstack_plan.config.ranges import CountRange
from dstack_plan.config.run_fields import InstanceVolumeMount, RegistryAuth
from dstack_plan.config.runs import (
    DevEnvironmentSpec,
    NodeGroup,
    RunSpec,
    ServiceSpec,
    TaskSpec,
)
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import DstackPlanError
from dstack_plan.plan.limits import address_groups
from dstack_plan.providers.base import GPU
from dstack_plan.providers.matching import gpus_needed
from dstack_plan.scheduler.placement import JobDemand

GB = 2**30


class JobSlot(NamedTuple):
    """Which job of a run: replica (services) and node (multi-node tasks)."""

    replica: int
    node: int


def job_id(run_name: str, slot: JobSlot, generation: int, deployment: str) -> str:
    """`<run>-<replica>-<node>-<generation>-<deployment>`; the deployment key keeps two
    projects with a run of the same name apart on a shared machine."""
    return f"{run_name}-{slot.replica}-{slot.node}-{generation}-{deployment}"


def slots(spec: RunSpec, replicas: int | None = None) -> list[JobSlot]:
    """The jobs a run has: nodes of a task, replicas of a service, one for a dev environment."""
    if isinstance(spec, TaskSpec):
        return [JobSlot(0, n) for n in range(spec.node_count())]
    if isinstance(spec, ServiceSpec):
        count = replicas if replicas is not None else initial_replicas(spec)
        return [JobSlot(r, 0) for r in range(count)]
    return [JobSlot(0, 0)]


def initial_replicas(spec: ServiceSpec) -> int:
    groups = spec.replica_groups()
    if groups:
        return sum(_group_replicas(g.replicas or g.count) for g in groups)
    replicas = spec.replicas
    assert not isinstance(replicas, tuple)  # a tuple is replica groups, counted above
    low = replicas.min or 0
    return max(low, 1) if replicas.max else low


def _group_replicas(count: CountRange | None) -> int:
    return (count.min or 0) if count else 1


class JobContext(NamedTuple):
    run_name: str
    run_id: str
    generation: int
    deployment: str
    nodes_num: int
    master_ip: str
    node_ips: tuple[str, ...]


def build_job(
    spec: RunSpec,
    slot: JobSlot,
    ctx: JobContext,
    secrets: SecretStore,
    run_args: str = "",
    environ: Mapping[str, str] | None = None,
    code: str | None = None,
    host_gpus: Sequence[GPU] = (),
    disks: Sequence[DiskMount] = (),
    ssh_public_key: str | None = None,
) -> JobSpec:
    """The agent's job spec for one slot; secret values travel as SecretStr, never logged.
    `code`: the sha256 of the run's code archive, uploaded to the job's agent beforehand;
    `host_gpus`: the GPUs of its machine (how many a `total_memory` takes depends on them);
    `disks`: the network volumes attached to its machine for it; `ssh_public_key`: the key
    the job's SSH server lets in (a dev environment's: the project key, `dstack attach`)."""
    environ = os.environ if environ is None else environ
    values = {
        "run": {"args": run_args, "name": ctx.run_name},
        "env": dict(environ),
        "groups": _group_ips(spec, ctx),
    }
    env: dict[str, str | SecretStr] = {}
    bare: dict[str, None] = {}  # the secrets' own values, for the agent to mask: in order
    for key, value in spec.env.items():
        if value is None:
            if key not in environ:
                raise DstackPlanError(
                    f"{ctx.run_name}: env {key} has no value; export {key}=... before applying"
                )
            env[key] = environ[key]
            continue
        env[key] = _resolve(value, values, secrets, ctx.run_name)
        bare.update(dict.fromkeys(_secret_values(value, secrets)))
    gpus = gpus_needed(spec.resources.gpu, host_gpus)
    env.update(_dstack_env(ctx, slot, gpus))
    commands = [_plain(c, values, ctx.run_name) for c in _commands(spec, slot)]
    return JobSpec(
        id=job_id(ctx.run_name, slot, ctx.generation, ctx.deployment),
        run_name=ctx.run_name,
        run_id=ctx.run_id,
        image=spec.image,
        commands=commands,
        entrypoint=[entrypoint] if (entrypoint := getattr(spec, "entrypoint", None)) else None,
        env=env,
        working_dir=spec.working_dir,
        user=spec.user,
        ports=[PortMapping(container_port=p) for p in container_ports(spec, slot)],
        gpus=gpus,
        gpu_share=spec.resources.gpu.share,
        shm_size=int(spec.resources.shm_size * GB) if spec.resources.shm_size else None,
        volumes=[
            VolumeMount(host_path=v.instance_path, container_path=v.path)
            for v in spec.volumes
            if isinstance(v, InstanceVolumeMount)
        ],
        disks=list(disks),
        network_mode=network_mode(spec),
        labels={
            "deployment": ctx.deployment,
            "generation": str(ctx.generation),
            "address": f"{run_kind(spec)}.{ctx.run_name}",
        },
        privileged=spec.privileged or spec.docker,
        stop_timeout=_seconds(spec.stop_duration) or 0.0,
        max_duration=_seconds(spec.max_duration),
        registry_auth=_credentials(spec.registry_auth, values, secrets, ctx.run_name),
        code=code,
        ssh=SSHAccess(public_key=ssh_public_key) if ssh_public_key else None,
        # a secret that is a whole env value is masked as that value already
        mask=[SecretStr(v) for v in bare if not any(_is(e, v) for e in env.values())],
    )


def _is(value: str | SecretStr, secret: str) -> bool:
    return isinstance(value, SecretStr) and value.get_secret_value() == secret


def _secret_values(text: str, secrets: SecretStore) -> list[str]:
    """The values of the secrets `text` refers to (`${{ secrets.X }}`)."""
    refs = interpolation.parse_references(text)
    names = sorted({r.name for r in refs if r.namespace == "secrets"})
    return [secrets.get(name).reveal() for name in names]


def _credentials(
    auth: RegistryAuth | None, values: dict[str, dict[str, str]], secrets: SecretStore, run: str
) -> RegistryCredentials | None:
    """`registry_auth` with its `${{ secrets.X }}` and `${{ env.X }}` references resolved."""
    if auth is None:
        return None
    resolved = {
        name: _resolve(text, values, secrets, run)
        for name, text in (("username", auth.username), ("password", auth.password))
    }
    return RegistryCredentials.model_validate(resolved)


def _commands(spec: RunSpec, slot: JobSlot) -> list[str]:
    if isinstance(spec, TaskSpec) and spec.groups:
        node = slot.node
        for group in spec.groups:
            if node < group.nodes:
                return list(group.commands)
            node -= group.nodes
    if isinstance(spec, DevEnvironmentSpec):
        return [*spec.init, "echo 'dev environment is ready'", "tail -f /dev/null"]
    return list(getattr(spec, "commands", ()))


def network_mode(spec: RunSpec) -> Literal["host", "bridge"]:
    """`bridge` for a container with ports, so Docker maps each to a free host port and
    replicas on one host never clash; `host` for the rest. The nodes of a multi-node task
    keep the host network (they reach each other by host address, and each has its own
    machine), and a job without an image is a plain process, on the host network. So does a
    dev environment (as dstack's do): an IDE's port forwards through its SSH session arrive
    on the host's loopback (`agent/job_sshd.py`), where only the host network meets them."""
    if spec.image is None or (isinstance(spec, TaskSpec) and spec.node_count() > 1):
        return "host"
    if isinstance(spec, DevEnvironmentSpec):
        return "host"
    if isinstance(spec, ServiceSpec) or container_ports(spec, JobSlot(0, 0)):
        return "bridge"
    return "host"


def container_ports(spec: RunSpec, slot: JobSlot) -> tuple[int, ...]:
    """The ports the job of `slot` listens on: a service's `port`, a task's (or its node
    group's) and a dev environment's `ports`."""
    if isinstance(spec, ServiceSpec):
        return (spec.port.container_port,)
    if isinstance(spec, TaskSpec) and spec.groups:
        node = slot.node
        for group in spec.groups:
            if node < group.nodes:
                return tuple(dict.fromkeys(p.container_port for p in group.ports))
            node -= group.nodes
        return ()
    return tuple(dict.fromkeys(p.container_port for p in getattr(spec, "ports", ())))


def host_ports(spec: RunSpec, slot: JobSlot) -> tuple[int, ...]:
    """The ports the job binds on its host itself: all of them on the host network, none
    for a bridged container (Docker maps those to free host ports)."""
    if network_mode(spec) == "bridge":
        return ()
    return container_ports(spec, slot)


def job_demands(spec: RunSpec, replicas: int | None = None) -> list[JobDemand]:
    """What each job of the run needs from the machine it is placed on, for the scheduler."""
    wanted = slots(spec, replicas)
    groups = spec.groups if isinstance(spec, TaskSpec) and spec.groups else None
    demands = []
    for slot in wanted:
        if isinstance(spec, ServiceSpec):
            label = f"replica {slot.replica}"
        elif len(wanted) > 1:
            label = f"node {slot.node}"
        else:
            label = "job"
        resources = _group_of(groups, slot.node).resources if groups else spec.resources
        demands.append(JobDemand(label, resources, host_ports(spec, slot)))
    return demands


def _group_of(groups: tuple[NodeGroup, ...], node: int) -> NodeGroup:
    for group in groups:
        if node < group.nodes:
            return group
        node -= group.nodes
    return groups[-1]


def _seconds(duration: int | str | None) -> float | None:
    """A duration field's seconds; None for `off` (or unset)."""
    return None if duration is None or duration == "off" else float(duration)


def run_kind(spec: RunSpec) -> str:
    """`task`, `service` or `dev-environment`: the kind of address the run has."""
    if isinstance(spec, TaskSpec):
        return "task"
    return "service" if isinstance(spec, ServiceSpec) else "dev-environment"


def _dstack_env(ctx: JobContext, slot: JobSlot, gpus: int) -> dict[str, str | SecretStr]:
    return {
        "DSTACK_RUN_NAME": ctx.run_name,
        "DSTACK_RUN_ID": ctx.run_id,
        "DSTACK_JOB_ID": job_id(ctx.run_name, slot, ctx.generation, ctx.deployment),
        "DSTACK_NODE_RANK": str(slot.node),
        "DSTACK_NODES_NUM": str(ctx.nodes_num),
        "DSTACK_MASTER_NODE_IP": ctx.master_ip,
        "DSTACK_NODES_IPS": "\n".join(ctx.node_ips),
        "DSTACK_GPUS_PER_NODE": str(gpus),
        "DSTACK_GPUS_NUM": str(gpus * ctx.nodes_num),
        "DSTACK_REPLICA_NUM": str(slot.replica),
    }


def _group_ips(spec: RunSpec, ctx: JobContext) -> dict[str, str]:
    """`${{ groups[i].nodes[j].IP_ADDRESS }}` and `groups[i].replicas[j]`: the address of the
    machine job j of group i runs on, as DSTACK_NODES_IPS lists them. A service's replicas
    all run on the run's machine (its master address)."""
    member, sizes = address_groups(spec)
    if member == "replicas":
        return interpolation.group_values(member, [[ctx.master_ip] * n for n in sizes])
    ips = iter(ctx.node_ips)
    rows = [[next(ips, ctx.master_ip) for _ in range(n)] for n in sizes]
    return interpolation.group_values(member, rows)


def _resolve(
    text: str, values: dict[str, dict[str, str]], secrets: SecretStore, run: str
) -> str | SecretStr:
    refs = interpolation.parse_references(text)
    secret_names = {r.name for r in refs if r.namespace == "secrets"}
    if not secret_names:
        return _plain(text, values, run)
    resolved = {name: secrets.get(name).reveal() for name in secret_names}
    return SecretStr(_substitute(text, {**values, "secrets": resolved}, run))


def _plain(text: str, values: dict[str, dict[str, str]], run: str) -> str:
    if any(r.namespace == "secrets" for r in interpolation.parse_references(text)):
        raise DstackPlanError(
            f"{run}: secrets may only be used in env and registry_auth, not in {text!r}"
        )
    return _substitute(text, values, run)


def _substitute(text: str, values: dict[str, dict[str, str]], run: str) -> str:
    try:
        return interpolation.resolve(text, values)
    except KeyError as e:
        raise DstackPlanError(f"{run}: {e.args[0]} is not set (needed by {text!r})") from None


def stop_seconds(spec: RunSpec) -> float:
    """Seconds between SIGTERM and SIGKILL: the run's `stop_duration` (0 when off)."""
    duration = spec.stop_duration
    return 0.0 if duration == "off" or duration is None else float(duration)
