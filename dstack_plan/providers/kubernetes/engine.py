"""Runs as Kubernetes objects: created, listed, stopped, read and removed through the API.

Where the other providers hand a run's jobs to our agent on each machine, a Kubernetes cluster
runs them itself: `KubernetesEngine` speaks the job half of the agent's interface (`JobInfo`
answers, our job ids, logs by offset) on top of Jobs, Deployments and pods
(`providers/kubernetes/manifests.py`), so what reads jobs (refresh, watch, `ps`, `logs`)
reads a Kubernetes run's the same way. A task's nodes are one indexed Job (node i: the pod of
completion index i); each service replica is one Deployment. Every object we create carries
the `dstack-plan/managed` label, and one listing (Jobs, Deployments, pods) answers every
question about them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dstack_plan.agent.api_models import JobInfo, JobSpec, JobStatus, PublishedPort
from dstack_plan.clock import Clock, SystemClock
from dstack_plan.config.kubernetes_backend import KubernetesCluster
from dstack_plan.errors import AgentError, ProviderError
from dstack_plan.providers.engine_jobs import LOG_CHUNK, EngineJobs, checked_spec
from dstack_plan.providers.kubernetes import manifests as m
from dstack_plan.providers.kubernetes.api import KUBERNETES, KubeAPI, KubeUnreachable
from dstack_plan.providers.kubernetes.nodes import NodeGroup, node_groups
from dstack_plan.providers.kubernetes.states import pending_reason, pod_outcome

if TYPE_CHECKING:
    from dstack_plan.providers.ssh.forward import Forward

SELECTOR = f"{m.MANAGED}=true"


@dataclass
class Owned:
    """One run's Job (a task) or Deployment (a replica) with its pods, by node index."""

    name: str
    kind: str
    """`job` or `deployment`."""
    ids: list[str]
    meta: dict[str, Any]
    stopped: bool
    pods: dict[int, Any] = field(default_factory=dict)
    failed: str | None = None
    """Why the Job ended without a pod for every node (its Failed condition)."""
    ports: list[int] = field(default_factory=list)


class KubernetesEngine:
    """The jobs of one cluster (one kubeconfig context and namespace)."""

    unreachable: tuple[type[Exception], ...] = (KubeUnreachable,)

    def __init__(self, cluster: KubernetesCluster, clock: Clock | None = None):
        self.cluster = cluster
        self.api = KubeAPI(cluster)
        self.clock = clock or SystemClock()

    @property
    def name(self) -> str:
        return self.cluster.name

    def jobs(self) -> EngineJobs:
        """The cluster's jobs behind the job half of the agent's interface."""
        return EngineJobs(self)

    async def submit(
        self, request: m.KubeRequest, specs: Sequence[JobSpec], kind: str
    ) -> list[JobInfo]:
        """Create one run's objects for `specs` (a task's nodes, node 0 first, as one
        indexed Job; or one service replica as a Deployment): their answers as the agent
        would give them, all `submitted`. The env goes in a Secret the pods read."""
        if not specs:
            return []
        first = checked_spec(specs[0], KUBERNETES)
        ids = [s.id for s in specs]
        name = m.object_name(first.run_name, ids[0])
        tags = m.labels(name, first.run_name)
        now = self.clock.now()
        spec = first.to_dict(redact=True)
        notes = m.run_annotations(
            ids,
            {
                "run_name": first.run_name,
                "run_id": first.run_id,
                "submitted_at": now,
                "spec": spec,
            },
        )
        addresses = m.node_names(name, self.api.namespace, len(ids))
        command = m.node_command(
            ids, first.commands, first.working_dir, addresses, first.gpu_count
        )
        ports = [p.container_port for p in first.ports]
        env = {k: v for k, v in first.env.items() if k not in m.PER_NODE_VARS}
        ns = self.api.namespace
        core, created = self.api.core, []
        try:
            await self.api.call(
                f"creating the Secret of {name}",
                core.create_namespaced_secret,
                ns,
                m.env_secret(name, tags, env),
            )
            created.append(("secret", f"{name}-env"))
            if kind == "task":
                service = m.headless_service(name, tags)
                owner = m.task_job(name, tags, notes, request, command, ports)
            else:
                service = m.replica_service(name, tags, ports)
                owner = m.replica_deployment(name, tags, notes, request, command, ports)
            if kind == "task" or ports:
                await self.api.call(
                    f"creating the Service of {name}", core.create_namespaced_service, ns, service
                )
                created.append(("service", name))
            if kind == "task":
                await self.api.call(
                    f"creating Job {name}", self.api.batch.create_namespaced_job, ns, owner
                )
            else:
                await self.api.call(
                    f"creating Deployment {name}",
                    self.api.apps.create_namespaced_deployment,
                    ns,
                    owner,
                )
        except Exception:
            for what, object_name in created:  # nothing half-made is left behind
                await self._delete_object(what, object_name)
            raise
        return [
            JobInfo(
                id=job_id,
                run_name=first.run_name,
                run_id=first.run_id,
                runtime="docker",
                status=JobStatus.SUBMITTED,
                submitted_at=now,
                spec=spec,
            )
            for job_id in ids
        ]

    async def listing(self) -> dict[str, Owned]:
        """Every run of ours in the namespace, by object name, with its pods."""
        ns = self.api.namespace
        jobs = await self.api.call(
            "listing Jobs", self.api.batch.list_namespaced_job, ns, label_selector=SELECTOR
        )
        deployments = await self.api.call(
            "listing Deployments",
            self.api.apps.list_namespaced_deployment,
            ns,
            label_selector=SELECTOR,
        )
        pods = await self.api.call(
            "listing pods", self.api.core.list_namespaced_pod, ns, label_selector=SELECTOR
        )
        owned: dict[str, Owned] = {}
        for kind, items in (("job", jobs.items), ("deployment", deployments.items)):
            for item in items:
                found = _owned(kind, item)
                if found is not None:
                    owned[found.name] = found
        for pod in pods.items:
            labels = pod.metadata.labels or {}
            run = owned.get(labels.get(m.KEY, ""))
            if run is None:
                continue
            index = int(labels.get(m.INDEX, "0") or 0)
            held = run.pods.get(index)
            # the newest pod of a node speaks for it (a replaced one may linger, ending)
            if held is None or _created(pod) >= _created(held):
                run.pods[index] = pod
        return owned

    async def list_jobs(self, run_name: str | None = None) -> list[JobInfo]:
        """Our jobs on the cluster (only `run_name`'s when given), oldest first."""
        found: list[JobInfo] = []
        for run in (await self.listing()).values():
            if run_name is None or run.meta.get("run_name") == run_name:
                found += self._infos(run)
        return sorted(found, key=lambda i: (i.submitted_at, i.id))

    async def get_job(self, job_id: str) -> JobInfo:
        """Job `job_id` as it stands; AgentError 404 when the cluster has no such job."""
        run = await self._run_of(job_id)
        return next(i for i in self._infos(run) if i.id == job_id)

    async def stop(self, job_id: str, timeout: float, abort: bool = False) -> JobInfo:
        """Stop the run `job_id` belongs to (all its nodes) and return at once: its Job is
        suspended (a Deployment scaled to 0), so nothing starts again, and each pod is
        deleted with `timeout` seconds of grace (SIGTERM now, SIGKILL after; none with
        `abort`), which the kubelet enforces."""
        run = await self._run_of(job_id)
        ns = self.api.namespace
        patch: dict[str, Any] = {
            "metadata": {"annotations": {m.STOPPED: json.dumps({"at": self.clock.now()})}}
        }
        if run.kind == "job":
            patch["spec"] = {"suspend": True}
            await self.api.call(
                f"stopping Job {run.name}",
                self.api.batch.patch_namespaced_job,
                run.name,
                ns,
                patch,
            )
        else:
            patch["spec"] = {"replicas": 0}
            await self.api.call(
                f"stopping Deployment {run.name}",
                self.api.apps.patch_namespaced_deployment,
                run.name,
                ns,
                patch,
            )
        grace = 0 if abort else max(0, math.ceil(timeout))
        from kubernetes import client as k8s

        for pod in run.pods.values():
            await self.api.absent_ok(
                f"deleting pod {pod.metadata.name}",
                self.api.core.delete_namespaced_pod,
                pod.metadata.name,
                ns,
                body=k8s.V1DeleteOptions(grace_period_seconds=grace),
            )
        return await self.get_job(job_id)

    async def delete(self, job_id: str) -> None:
        """Remove the run `job_id` belongs to: its Job or Deployment (its pods with it),
        Service and env Secret. A run that is gone already is no error."""
        try:
            run = await self._run_of(job_id)
        except AgentError as e:
            if e.status == 404:
                return
            raise
        await self._delete_object(run.kind, run.name)
        await self._delete_object("service", run.name)
        await self._delete_object("secret", f"{run.name}-env")

    async def logs(
        self, job_id: str, offset: int = 0, limit: int = LOG_CHUNK
    ) -> tuple[bytes, int, bool]:
        """Up to `limit` bytes of job `job_id`'s output (its pod's log) from `offset`: (the
        bytes, the log's size, whether the job has ended). A pod that is gone took its log
        with it: what Kubernetes keeps is all there is."""
        run = await self._run_of(job_id)
        index = run.ids.index(job_id)
        info = next(i for i in self._infos(run) if i.id == job_id)
        pod = run.pods.get(index)
        if pod is None or info.status in (JobStatus.SUBMITTED, JobStatus.PULLING):
            return b"", 0, info.finished
        try:
            answer = await self.api.call(
                f"reading the log of {pod.metadata.name}",
                self.api.core.read_namespaced_pod_log,
                pod.metadata.name,
                self.api.namespace,
                container=m.CONTAINER,
                _preload_content=False,
            )
        except KubeUnreachable:
            raise
        except ProviderError:  # not started yet, or gone between the listing and now
            return b"", 0, info.finished
        data: bytes = answer.data  # the raw response: `_preload_content=False`
        return data[offset : offset + limit], len(data), info.finished

    async def node_groups(self) -> list[NodeGroup]:
        """The cluster's nodes grouped by GPU model, as they are now."""
        nodes = await self.api.call("listing nodes", self.api.core.list_node)
        return node_groups(nodes.items, self.cluster.gpu_label)

    async def create_claim(self, claim: Any) -> Any:
        """Create PersistentVolumeClaim `claim` in the namespace; the claim as created."""
        return await self.api.call(
            f"creating claim {claim.metadata.name}",
            self.api.core.create_namespaced_persistent_volume_claim,
            self.api.namespace,
            claim,
        )

    async def read_claim(self, name: str, missing_ok: bool = False) -> Any | None:
        """PersistentVolumeClaim `name` of the namespace (None when gone and `missing_ok`)."""
        try:
            return await self.api.call(
                f"reading claim {name}",
                self.api.core.read_namespaced_persistent_volume_claim,
                name,
                self.api.namespace,
            )
        except KubeUnreachable:
            raise
        except ProviderError as e:
            if missing_ok and _status(e) == 404:
                return None
            raise

    async def delete_claim(self, name: str) -> None:
        """Delete PersistentVolumeClaim `name` (gone already: no error)."""
        await self.api.absent_ok(
            f"deleting claim {name}",
            self.api.core.delete_namespaced_persistent_volume_claim,
            name,
            self.api.namespace,
        )

    async def check_namespace(self) -> None:
        """That the namespace exists and the credentials may read it."""
        await self.api.call(
            f"reading namespace {self.api.namespace}",
            self.api.core.read_namespace,
            self.api.namespace,
        )

    async def forward(self, address: str, port: int, local_port: int = 0) -> Forward:
        """Service `address`'s `port` on this machine's 127.0.0.1, through the API server's
        service proxy (HTTP only: `providers/kubernetes/relay.py`)."""
        from dstack_plan.providers.kubernetes.relay import open_relay

        return await open_relay(self.api, address, port, local_port)

    async def close(self) -> None:
        self.api.close()

    async def _run_of(self, job_id: str) -> Owned:
        for run in (await self.listing()).values():
            if job_id in run.ids:
                return run
        raise AgentError(self.name, f"no job {job_id}", status=404, code="not_found")

    async def _delete_object(self, kind: str, name: str) -> None:
        from kubernetes import client as k8s

        ns = self.api.namespace
        gone = k8s.V1DeleteOptions(propagation_policy="Background")
        calls = {
            "job": self.api.batch.delete_namespaced_job,
            "deployment": self.api.apps.delete_namespaced_deployment,
            "service": self.api.core.delete_namespaced_service,
            "secret": self.api.core.delete_namespaced_secret,
        }
        await self.api.absent_ok(f"deleting {kind} {name}", calls[kind], name, ns, body=gone)

    def _infos(self, run: Owned) -> list[JobInfo]:
        """Each node of `run` as a JobInfo."""
        submitted = float(run.meta.get("submitted_at") or 0.0)
        recorded = run.meta.get("spec")
        spec: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        infos = []
        for index, job_id in enumerate(run.ids):
            pod = run.pods.get(index)
            outcome = pod_outcome(pod, run.stopped, run.failed)
            ports: list[PublishedPort] = []
            if outcome.status is JobStatus.RUNNING and run.kind == "deployment":
                # reached as the replica's Service, through the API server
                ports = [
                    PublishedPort(container_port=p, host_port=p, host_ip=run.name)
                    for p in run.ports
                ]
            message = outcome.message
            if outcome.status is JobStatus.SUBMITTED:
                message = pending_reason(pod)
            infos.append(
                JobInfo(
                    id=job_id,
                    run_name=str(run.meta.get("run_name") or ""),
                    run_id=run.meta.get("run_id"),
                    runtime="docker",
                    status=outcome.status,
                    termination_reason=outcome.reason,
                    termination_message=message,
                    exit_code=outcome.exit_code,
                    submitted_at=submitted,
                    started_at=outcome.started_at,
                    finished_at=outcome.finished_at,
                    ports=ports,
                    spec=spec,
                )
            )
        return infos


def _owned(kind: str, item: Any) -> Owned | None:
    notes = item.metadata.annotations or {}
    try:
        ids = json.loads(notes.get(m.IDS, "[]"))
        meta = json.loads(notes.get(m.META, "{}"))
    except ValueError:
        return None
    if not isinstance(ids, list) or not ids or not isinstance(meta, dict):
        return None
    failed = None
    for condition in getattr(item.status, "conditions", None) or []:
        if (
            kind == "job"
            and condition.type in ("Failed", "Complete")
            and condition.status == "True"
        ):
            failed = f"Kubernetes ended Job {item.metadata.name}: " + (
                condition.message or condition.reason or condition.type
            )
    template = item.spec.template.spec.containers[0]
    ports = [p.container_port for p in template.ports or []]
    return Owned(
        name=item.metadata.name,
        kind=kind,
        ids=[str(i) for i in ids],
        meta=meta,
        stopped=m.STOPPED in notes,
        failed=failed,
        ports=ports,
    )


def _status(e: ProviderError) -> int | None:
    """The HTTP status of the refusal behind `e`, if an API call's."""
    return getattr(e.__cause__, "status", None)


def _created(pod: Any) -> float:
    stamp = pod.metadata.creation_timestamp
    return stamp.timestamp() if stamp is not None else 0.0
