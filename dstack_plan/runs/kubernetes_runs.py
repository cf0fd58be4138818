"""Runs on a Kubernetes fleet: one submission to the cluster; its scheduler places the pods.

A run goes to a node group (the first whose nodes have what one node of the run asks:
`providers/kubernetes/nodes.py`), pinned there by a nodeSelector on the GPU label, and the
cluster's scheduler, quotas and priorities decide when its pods start. A task's N nodes are
one indexed Job; each service replica is a Deployment of one pod with a Service, which
watch's proxy reaches through the API server (`providers/kubernetes/relay.py`). See the
field-to-request table in `providers/kubernetes/manifests.py` and docs/kubernetes.md.

A run's `volumes:` (`name:/path`) mount the PersistentVolumeClaims of `type: volume` entries
with `backend: kubernetes` (`volumes/kubernetes.py`). What a Kubernetes fleet cannot run yet
is refused here, at plan time and again at apply: dev environments, local `files:` /
`repos:`, a node's directories as volumes, node and replica groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.config.kubernetes_backend import KubernetesCluster
from dstack_plan.config.run_fields import NetworkVolumeMount
from dstack_plan.config.runs import RunSpec, ServiceSpec, TaskSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.kubernetes_records import KubernetesFleetRecord
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.plan.model import Placement
from dstack_plan.providers.kubernetes.engine import KubernetesEngine
from dstack_plan.providers.kubernetes.manifests import KubeRequest
from dstack_plan.providers.kubernetes.nodes import NodeGroup, choose_group, describe
from dstack_plan.providers.matching import gpus_wanted
from dstack_plan.providers.names import KUBERNETES
from dstack_plan.runs.cluster_runs import cluster_machine, not_yet
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job, slots, stop_seconds
from dstack_plan.runs.submission import Submitted
from dstack_plan.state.model import State


def engine_refusal(spec: RunSpec) -> str | None:
    """Why a Kubernetes fleet cannot run `spec` in this version; None when it can."""
    why = not_yet(spec, "Kubernetes", "bake them into the image")
    if why is not None:
        return why
    for mount in spec.volumes:
        if not isinstance(mount, NetworkVolumeMount):
            return (
                f"volume {mount.instance_path}:{mount.path}: a Kubernetes pod mounts "
                "PersistentVolumeClaims (`type: volume` with `backend: kubernetes`), not "
                "directories of a node"
            )
        if not isinstance(mount.name, str) or "${{" in mount.name:
            return "volumes: one claim per node is not mounted on Kubernetes yet"
    return None


def volume_claims(
    spec: RunSpec, state: State, cluster: KubernetesCluster
) -> list[tuple[str, str]]:
    """(claim, mount path) of each of `spec`'s volumes, as state records them; ProviderError
    for one that is not a claim of `cluster` (one not created yet is skipped: the plan runs
    before it exists, the apply after)."""
    claims = []
    for mount in spec.volumes:
        assert isinstance(mount, NetworkVolumeMount) and isinstance(mount.name, str)
        entry = state.get(f"volume.{mount.name}")
        if entry is None or not entry.attributes.get("id"):
            continue
        where = entry.attributes.get("region")
        if entry.provider != KUBERNETES or where != cluster.name:
            raise ProviderError(
                KUBERNETES,
                f"volume {mount.name} is on {entry.provider} {where or ''}, not a claim of "
                f"cluster {cluster.name}".replace("  ", " "),
            )
        claims.append((str(entry.attributes["id"]), mount.path))
    return claims


@dataclass(frozen=True)
class KubePlan:
    """Where a run goes on a Kubernetes fleet and what each of its pods asks for."""

    group: NodeGroup
    request: KubeRequest


def plan_run(spec: RunSpec, record: KubernetesFleetRecord, state: State | None = None) -> KubePlan:
    """The node group and request of `spec` on fleet `record` (the same at plan and at
    apply), with the claims of its volumes as `state` records them; ProviderError saying why
    when it cannot go there."""
    why = engine_refusal(spec)
    if why is not None:
        raise ProviderError(KUBERNETES, why)
    assert isinstance(spec, TaskSpec | ServiceSpec)
    nodes = spec.node_count() if isinstance(spec, TaskSpec) else 1
    chosen = choose_group(spec.resources, nodes, record.node_groups)
    if isinstance(chosen, str):
        raise ProviderError(
            KUBERNETES, f"no node group of cluster {record.cluster.name} can take it: {chosen}"
        )
    request = kube_request(spec, chosen, record.cluster, nodes)
    if state is not None and spec.volumes:
        claims = tuple(volume_claims(spec, state, record.cluster))
        request = dataclasses.replace(request, claims=claims)
    return KubePlan(chosen, request)


def kube_request(
    spec: TaskSpec | ServiceSpec, group: NodeGroup, cluster: KubernetesCluster, nodes: int
) -> KubeRequest:
    """What each pod of `spec` asks on `group` (the table in `manifests.py`)."""
    resources = spec.resources
    gpus = gpus_wanted(resources.gpu)
    memory = resources.memory.min
    selector = {}
    if gpus and group.gpu_label and group.gpu_label_key:
        selector[group.gpu_label_key] = group.gpu_label
    max_duration = None if spec.max_duration in (None, "off") else float(spec.max_duration)
    return KubeRequest(
        group=group.name,
        nodes=nodes,
        image=spec.image or cluster.default_image,
        cpu=resources.cpu.count.min or None,
        memory_mib=int(memory * 1024) if memory else None,
        gpus=gpus,
        gpu_resource=group.gpu_resource if gpus else None,
        node_selector=selector,
        shm_mib=int(resources.shm_size * 1024) if resources.shm_size else None,
        max_duration=int(max_duration) if max_duration else None,
        stop_seconds=int(stop_seconds(spec)),
        image_pull_secret=cluster.image_pull_secret,
    )


def placement_note(plan: KubePlan, record: KubernetesFleetRecord) -> str:
    """What the plan shows of a run on a Kubernetes fleet: the node group and the request."""
    cluster = record.cluster
    return (
        f"Kubernetes {cluster.name} (namespace {cluster.namespace}), nodes {plan.group.name}: "
        f"{plan.request.summary()}"
    )


async def plan_placement(
    machines: FleetMachines, fleet: str, spec: RunSpec, state: State, now: float
) -> Placement:
    """Where a run would go on Kubernetes fleet `fleet`; placed False with the reason when
    no node group can ever take it. Whether its pods start now is the cluster's scheduler's
    to say: the plan does not guess."""
    entry = machines.recorded(fleet, state)
    assert entry is not None
    record = KubernetesFleetRecord.of(entry)
    try:
        plan = plan_run(spec, record, state)
    except ProviderError as e:
        groups = describe(record.node_groups)
        return Placement(
            fleet=fleet, provider=KUBERNETES, placed=False, note=f"{e.detail} [{groups}]"
        )
    return Placement(
        fleet=fleet,
        provider=KUBERNETES,
        hosts=(record.cluster.name,),
        placed=True,
        note=placement_note(plan, record),
    )


async def submit_run(
    machines: FleetMachines,
    fleet: str,
    state: State,
    spec: RunSpec,
    context: JobContext,
    secrets: SecretStore,
    ctx: ApplyContext,
    address: str,
    only: Sequence[JobSlot] | None = None,
) -> list[Submitted]:
    """Create `spec`'s objects (`only` those slots when given) on the cluster of Kubernetes
    fleet `fleet`: a task's nodes as one indexed Job, each replica of a service as its own
    Deployment; what was submitted, per slot."""
    entry = machines.recorded(fleet, state)
    assert entry is not None
    record = KubernetesFleetRecord.of(entry)
    engine = machines.engine(fleet, state)
    assert isinstance(engine, KubernetesEngine)
    plan = plan_run(spec, record, state)
    machine = cluster_machine(fleet, KUBERNETES, record.cluster.name, record.cluster.name)
    wanted = list(only) if only is not None else slots(spec)
    jobs = [build_job(spec, slot, context, secrets, ctx.run_args) for slot in wanted]
    ctx.progress(address, placement_note(plan, record))
    task = isinstance(spec, TaskSpec)
    groups = [jobs] if task else [[job] for job in jobs]
    infos = []
    for group in groups:
        infos += await engine.submit(plan.request, group, "task" if task else "replica")
    return [Submitted(info, slot, machine) for info, slot in zip(infos, wanted, strict=True)]
