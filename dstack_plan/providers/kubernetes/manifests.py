"""The Kubernetes objects a run becomes (pure: the client's model objects, no I/O).

A task of N nodes is an indexed Job (`completionMode: Indexed`, N completions run at once,
no retries of its own: `retry:` is watch's) with a headless Service whose name is the pods'
subdomain, so node i is reachable in the cluster as `<name>-<i>.<name>`. Each replica of a
service is a Deployment of one pod and a Service in front of it, which watch's proxy reaches
through the API server. The env, secrets included, is a Secret the pods read (`envFrom`),
never a value in a pod spec.

| config field                  | Kubernetes request                                         |
|-------------------------------|------------------------------------------------------------|
| `nodes`                       | Job `completions` = `parallelism` = N, indexed             |
| `resources.cpu` (lower bound) | container `requests.cpu`                                   |
| `resources.memory` (lower)    | container `requests.memory` (Mi)                           |
| `resources.gpu` count         | container `limits` `nvidia.com/gpu` / `amd.com/gpu`        |
| `resources.gpu` name          | `nodeSelector` on the backend's `gpu_label`                |
| `resources.shm_size`          | an in-memory `emptyDir` at `/dev/shm`                      |
| `image` (else `default_image`)| container `image`                                          |
| `max_duration`                | pod `activeDeadlineSeconds`                                |
| `stop_duration`               | pod `terminationGracePeriodSeconds` (a stop's grace)       |
| `volumes` (`name:/path`)      | the claim of `volume.<name>`, mounted at `/path`            |
| `ports`                       | container ports; a service's Service ports                 |
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

CONTAINER = "run"
"""The one container of every pod we create."""
MANAGED = "dstack-plan/managed"
KEY = "dstack-plan/key"
RUN = "dstack-plan/run"
IDS = "dstack-plan/ids"
META = "dstack-plan/meta"
STOPPED = "dstack-plan/stopped"
INDEX = "batch.kubernetes.io/job-completion-index"
PER_NODE_VARS = ("DSTACK_NODE_RANK", "DSTACK_JOB_ID", "DSTACK_MASTER_NODE_IP", "DSTACK_NODES_IPS")
"""What each pod sets for itself (from its completion index), whatever the job's env says."""

_SLUG = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class KubeRequest:
    """What one node (pod) of a run asks of the cluster."""

    group: str
    """The node group it goes to (`providers/kubernetes/nodes.py`)."""
    nodes: int
    image: str
    cpu: float | None = None
    memory_mib: int | None = None
    gpus: int = 0
    gpu_resource: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    shm_mib: int | None = None
    max_duration: int | None = None
    stop_seconds: int = 0
    image_pull_secret: str | None = None
    claims: Sequence[tuple[str, str]] = ()
    """(PersistentVolumeClaim, mount path) pairs."""

    def requests(self) -> dict[str, str]:
        asked = {}
        if self.cpu:
            asked["cpu"] = _quantity(self.cpu)
        if self.memory_mib:
            asked["memory"] = f"{self.memory_mib}Mi"
        return asked

    def limits(self) -> dict[str, str]:
        # extended resources (GPUs) are asked as limits; Kubernetes sets the request equal
        return {self.gpu_resource: str(self.gpus)} if self.gpus and self.gpu_resource else {}

    def summary(self) -> str:
        """The request as the plan shows it."""
        asked = ", ".join(f"{k}: {v}" for k, v in {**self.requests(), **self.limits()}.items())
        where = ", ".join(f"{k}={v}" for k, v in self.node_selector.items())
        pods = f"{self.nodes} pod(s)" if self.nodes > 1 else "a pod"
        parts = [f"{pods} of {self.image}", f"{{{asked or 'no requests'}}}"]
        if where:
            parts.append(f"on {where}")
        if self.max_duration:
            parts.append(f"activeDeadlineSeconds {self.max_duration}")
        return " ".join(parts)


def object_name(run_name: str, key: str) -> str:
    """The name of a run's objects: readable, unique by `key` (our first job id), and short
    enough that a pod's hostname (`<name>-<index>`) stays a DNS label."""
    slug = _SLUG.sub("-", run_name.lower()).strip("-")[:30].strip("-") or "run"
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"dp-{slug}-{digest}"


def labels(name: str, run_name: str) -> dict[str, str]:
    """The labels every object of a run carries (how listings find ours)."""
    run = _SLUG.sub("-", run_name.lower()).strip("-")[:63].strip("-") or "run"
    return {MANAGED: "true", KEY: name, RUN: run}


def node_names(name: str, namespace: str, nodes: int) -> list[str]:
    """Each node's address in the cluster, in rank order: the pod's hostname under the
    headless Service (`<name>-<i>.<name>.<namespace>.svc`)."""
    return [f"{name}-{i}.{name}.{namespace}.svc" for i in range(nodes)]


def node_command(
    ids: Sequence[str],
    commands: Sequence[str],
    working_dir: str | None,
    addresses: Sequence[str],
    gpus: int,
) -> list[str]:
    """The container's command: set the variables each node decides from its completion
    index, then run the commands as the agent does (`sh -c` of them joined with `&&`)."""
    command = " && ".join(commands) if commands else "true"
    lines = [
        'rank="${JOB_COMPLETION_INDEX:-0}"',
        f"set -- {' '.join(shlex.quote(i) for i in ids)}",
        'shift "$rank"',
        'export DSTACK_NODE_RANK="$rank" DSTACK_JOB_ID="$1"',
        f"export DSTACK_MASTER_NODE_IP={shlex.quote(addresses[0] if addresses else '')}",
        f"export DSTACK_NODES_IPS={shlex.quote(chr(10).join(addresses))}",
        f"export DSTACK_GPUS_PER_NODE={gpus} DSTACK_GPUS_NUM={gpus * len(ids)}",
        "set --",
    ]
    if working_dir:
        lines.append(f"mkdir -p {shlex.quote(working_dir)} && cd {shlex.quote(working_dir)}")
    lines.append(f"exec /bin/sh -c {shlex.quote(command)}")
    return ["/bin/sh", "-c", "\n".join(lines)]


def env_secret(name: str, tags: Mapping[str, str], env: Mapping[str, str]) -> Any:
    """The Secret holding a run's env (secret values included: never in a pod spec)."""
    return k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(name=f"{name}-env", labels=dict(tags)),
        type="Opaque",
        string_data=dict(env),
    )


def pod_spec(
    name: str,
    request: KubeRequest,
    command: list[str],
    ports: Sequence[int],
    restart: str,
    subdomain: str | None = None,
) -> Any:
    """The pod of one node or replica."""
    mounts = [
        k8s.V1VolumeMount(name=f"claim-{i}", mount_path=path)
        for i, (_, path) in enumerate(request.claims)
    ]
    volumes = [
        k8s.V1Volume(
            name=f"claim-{i}",
            persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=claim),
        )
        for i, (claim, _) in enumerate(request.claims)
    ]
    if request.shm_mib:
        mounts.append(k8s.V1VolumeMount(name="shm", mount_path="/dev/shm"))
        volumes.append(
            k8s.V1Volume(
                name="shm",
                empty_dir=k8s.V1EmptyDirVolumeSource(
                    medium="Memory", size_limit=f"{request.shm_mib}Mi"
                ),
            )
        )
    container = k8s.V1Container(
        name=CONTAINER,
        image=request.image,
        command=command,
        env_from=[k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=f"{name}-env"))],
        resources=k8s.V1ResourceRequirements(
            requests=request.requests() or None, limits=request.limits() or None
        ),
        ports=[k8s.V1ContainerPort(container_port=p) for p in ports] or None,
        volume_mounts=mounts or None,
    )
    secrets = (
        [k8s.V1LocalObjectReference(name=request.image_pull_secret)]
        if request.image_pull_secret
        else None
    )
    return k8s.V1PodSpec(
        containers=[container],
        restart_policy=restart,
        subdomain=subdomain,
        node_selector=dict(request.node_selector) or None,
        termination_grace_period_seconds=request.stop_seconds,
        active_deadline_seconds=request.max_duration,
        volumes=volumes or None,
        image_pull_secrets=secrets,
    )


def run_annotations(ids: Sequence[str], meta: Mapping[str, Any]) -> dict[str, str]:
    """What a run's Job or Deployment records of it: our job ids (node order) and the
    redacted spec with when it was submitted."""
    return {IDS: json.dumps(list(ids)), META: json.dumps(dict(meta), sort_keys=True)}


def task_job(
    name: str,
    tags: Mapping[str, str],
    notes: Mapping[str, str],
    request: KubeRequest,
    command: list[str],
    ports: Sequence[int],
) -> Any:
    """The indexed Job of a task's nodes (every node at once; no retries of its own)."""
    return k8s.V1Job(
        metadata=k8s.V1ObjectMeta(name=name, labels=dict(tags), annotations=dict(notes)),
        spec=k8s.V1JobSpec(
            completion_mode="Indexed",
            completions=request.nodes,
            parallelism=request.nodes,
            backoff_limit=0,
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=dict(tags)),
                spec=pod_spec(name, request, command, ports, "Never", subdomain=name),
            ),
        ),
    )


def headless_service(name: str, tags: Mapping[str, str]) -> Any:
    """The Service that gives a task's pods their names (`<name>-<i>.<name>`), ready or not:
    node 0 must be found by the others before it answers."""
    return k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name=name, labels=dict(tags)),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None", selector={KEY: name}, publish_not_ready_addresses=True
        ),
    )


def replica_deployment(
    name: str,
    tags: Mapping[str, str],
    notes: Mapping[str, str],
    request: KubeRequest,
    command: list[str],
    ports: Sequence[int],
) -> Any:
    """The Deployment of one service replica (one pod, restarted by the kubelet)."""
    return k8s.V1Deployment(
        metadata=k8s.V1ObjectMeta(name=name, labels=dict(tags), annotations=dict(notes)),
        spec=k8s.V1DeploymentSpec(
            replicas=1,
            selector=k8s.V1LabelSelector(match_labels={KEY: name}),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=dict(tags)),
                spec=pod_spec(name, request, command, ports, "Always"),
            ),
        ),
    )


def replica_service(name: str, tags: Mapping[str, str], ports: Sequence[int]) -> Any:
    """The Service in front of a replica's pod, on its ports (watch's proxy reaches it
    through the API server)."""
    return k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name=name, labels=dict(tags)),
        spec=k8s.V1ServiceSpec(
            selector={KEY: name},
            ports=[
                k8s.V1ServicePort(name=f"p{p}", port=p, target_port=p, protocol="TCP")
                for p in ports
            ],
        ),
    )


def _quantity(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{int(cpus * 1000)}m"
