"""Where a run goes on a Kubernetes fleet and the objects it becomes (`runs/kubernetes_runs.py`,
`providers/kubernetes/manifests.py`, `providers/kubernetes/states.py`), decided from the node
groups the fleet recorded; every object checked against the official client's models."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client as k8s

from dstack_plan.agent.api_models import JobStatus, TerminationReason
from dstack_plan.config.kubernetes_backend import KubernetesCluster
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.kubernetes_records import KubernetesFleetRecord
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.kubernetes import manifests as m
from dstack_plan.providers.kubernetes.nodes import node_groups
from dstack_plan.providers.kubernetes.states import pending_reason, pod_outcome
from dstack_plan.runs.kubernetes_runs import plan_run
from tests.infra.kube_models import require_valid

CLUSTER = KubernetesCluster(name="prod", namespace="ml", image_pull_secret="regcred")


def node(name: str, gpus: int = 0, product: str | None = None, cpu: str = "32") -> Any:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    allocatable = {"cpu": cpu, "memory": "128Gi"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        spec=k8s.V1NodeSpec(),
        status=k8s.V1NodeStatus(
            allocatable=allocatable,
            conditions=[k8s.V1NodeCondition(type="Ready", status="True")],
        ),
    )


def record() -> KubernetesFleetRecord:
    nodes = [
        node("a1", 8, "NVIDIA-A100-SXM4-80GB"),
        node("a2", 8, "NVIDIA-A100-SXM4-80GB"),
        node("h1", 8, "NVIDIA-H100-80GB-HBM3"),
        node("h2", 8, "NVIDIA-H100-80GB-HBM3"),
        node("c1"),
    ]
    groups = node_groups(nodes, CLUSTER.gpu_label)
    return KubernetesFleetRecord(cluster=CLUSTER, node_groups=tuple(groups))


def spec(kind: str = "task", **fields: object) -> RunSpec:
    base: dict[str, object] = {"type": kind, "name": "train", "commands": ["true"]}
    if kind == "dev-environment":
        base.pop("commands")
    if kind == "service":
        base["port"] = 8000
    parsed = spec_from_normalized(kind, {**base, **fields})
    assert isinstance(parsed, RunSpec)
    return parsed


def wire(obj: Any) -> Any:
    return k8s.ApiClient().sanitize_for_serialization(obj)


def test_a_gpu_task_goes_to_the_group_of_its_model_with_its_request() -> None:
    plan = plan_run(
        spec(
            nodes=2,
            resources={"cpu": "4..", "memory": "16GB..", "gpu": "H100:4", "shm_size": "8GB"},
            max_duration="1h",
        ),
        record(),
    )
    assert plan.group.name == "NVIDIA-H100-80GB-HBM3"
    request = plan.request
    assert (request.nodes, request.gpus, request.gpu_resource) == (2, 4, "nvidia.com/gpu")
    assert request.requests() == {"cpu": "4", "memory": "16384Mi"}
    assert request.limits() == {"nvidia.com/gpu": "4"}
    assert request.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert (request.shm_mib, request.max_duration) == (8192, 3600)
    assert request.image == CLUSTER.default_image


def test_a_cpu_task_never_takes_gpu_nodes_and_too_many_nodes_is_refused() -> None:
    assert plan_run(spec(), record()).group.name == "cpu"
    assert plan_run(spec(), record()).request.node_selector == {}
    with pytest.raises(ProviderError) as refused:
        plan_run(spec(nodes=3, resources={"gpu": "A100:8"}), record())
    assert "no node group of cluster prod can take it" in str(refused.value)
    assert "the run needs 3" in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"files": ["data:/data"]}, "files: and repos:"),
        ({"volumes": ["/data:/data"]}, "mounts PersistentVolumeClaims"),
    ],
)
def test_what_a_kubernetes_fleet_cannot_run_yet_is_a_plan_error(
    fields: dict[str, object], said: str
) -> None:
    with pytest.raises(ProviderError, match=said):
        plan_run(spec(**fields), record())
    with pytest.raises(ProviderError, match="dev-environments cannot run"):
        plan_run(spec("dev-environment", ide="vscode"), record())


def test_a_task_is_an_indexed_job_with_a_headless_service_valid_for_the_client() -> None:
    request = plan_run(spec(nodes=2, resources={"gpu": "A100:1"}), record()).request
    name = m.object_name("Train_Big.run", "job-id-0")
    assert name.startswith("dp-train-big-run-") and len(name) <= 47
    tags = m.labels(name, "Train_Big.run")
    addresses = m.node_names(name, "ml", 2)
    command = m.node_command(["id-0", "id-1"], ["echo a", "echo b"], "/w", addresses, 1)
    job = wire(
        m.task_job(name, tags, m.run_annotations(["id-0", "id-1"], {}), request, command, [8080])
    )
    require_valid(job, "V1Job")
    assert job["spec"]["completionMode"] == "Indexed"
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert (pod["subdomain"], pod["restartPolicy"]) == (name, "Never")
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": f"{name}-env"}}]
    assert "env" not in pod["containers"][0]  # values only ever in the Secret
    service = wire(m.headless_service(name, tags))
    require_valid(service, "V1Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {m.KEY: name}
    secret = wire(m.env_secret(name, tags, {"TOKEN": "s3cret"}))
    require_valid(secret, "V1Secret")
    deployment = wire(m.replica_deployment(name, tags, {}, request, command, [8000]))
    require_valid(deployment, "V1Deployment")
    assert deployment["spec"]["template"]["spec"]["restartPolicy"] == "Always"
    require_valid(wire(m.replica_service(name, tags, [8000])), "V1Service")


def test_each_node_sets_its_rank_job_id_and_the_addresses_from_its_completion_index() -> None:
    addresses = m.node_names("dp-x", "ml", 2)
    command = m.node_command(
        ["id-0", "id 1"],
        [
            "echo $DSTACK_NODE_RANK $DSTACK_JOB_ID",
            'echo "$DSTACK_NODES_IPS"',
            "echo $DSTACK_MASTER_NODE_IP $DSTACK_GPUS_NUM",
        ],
        None,
        addresses,
        2,
    )
    ran = subprocess.run(
        command,
        env={"JOB_COMPLETION_INDEX": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.splitlines() == [
        "1 id 1",
        "dp-x-0.dp-x.ml.svc",
        "dp-x-1.dp-x.ml.svc",
        "dp-x-0.dp-x.ml.svc 4",
    ]


def _pod(phase: str, **status: Any) -> Any:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", deletion_timestamp=status.pop("deleting", None)),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="run")], restart_policy=status.pop("restart", "Never")
        ),
        status=k8s.V1PodStatus(phase=phase, **status),
    )


def _terminated(code: int) -> Any:
    when = datetime(2026, 12, 7, tzinfo=timezone.utc)
    return k8s.V1ContainerStatus(
        name="run",
        image="i",
        image_id="",
        ready=False,
        restart_count=0,
        state=k8s.V1ContainerState(
            terminated=k8s.V1ContainerStateTerminated(exit_code=code, finished_at=when)
        ),
    )


def test_a_pod_reads_as_an_agent_would_report_its_job() -> None:
    assert pod_outcome(None, stopped=False).status is JobStatus.SUBMITTED
    assert pod_outcome(None, stopped=True).status is JobStatus.TERMINATED
    gone = pod_outcome(None, stopped=False, gone="Kubernetes ended Job x: DeadlineExceeded")
    assert (gone.status, gone.message) == (
        JobStatus.FAILED,
        "Kubernetes ended Job x: DeadlineExceeded",
    )
    done = pod_outcome(_pod("Succeeded", container_statuses=[_terminated(0)]), stopped=False)
    assert (done.status, done.exit_code) == (JobStatus.DONE, 0)
    failed = pod_outcome(_pod("Failed", container_statuses=[_terminated(3)]), stopped=False)
    assert (failed.status, failed.reason, failed.message, failed.exit_code) == (
        JobStatus.FAILED,
        TerminationReason.CONTAINER_EXITED_WITH_ERROR,
        "exited with code 3",
        3,
    )
    lost = pod_outcome(_pod("Failed", reason="NodeLost", message="node a1 is gone"), stopped=False)
    assert (lost.status, lost.message) == (
        JobStatus.FAILED,
        "Kubernetes: NodeLost: node a1 is gone",
    )
    stopped = pod_outcome(_pod("Failed", container_statuses=[_terminated(143)]), stopped=True)
    assert (stopped.status, stopped.exit_code) == (JobStatus.TERMINATED, 143)
    unplaced = _pod(
        "Pending",
        conditions=[
            k8s.V1PodCondition(
                type="PodScheduled",
                status="False",
                reason="Unschedulable",
                message="0/4 nodes are available",
            )
        ],
    )
    assert pod_outcome(unplaced, stopped=False).status is JobStatus.SUBMITTED
    assert pending_reason(unplaced) == "0/4 nodes are available"
