"""The fake Kubernetes cluster (tests/infra/fake_kube.py) through the official client: it
behaves as Kubernetes' documentation says for the calls the Kubernetes backend makes.

Every test waits for outcomes with bounded polls (`wait_for`), never fixed sleeps, and
leaves the fake with every answer re-checked against the client's models.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.infra import kube_models
from tests.infra.fake_kube import FakeKube, FakeNode

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
NS = "default"


@dataclass
class Cluster:
    """A running fake and the client's APIs on it."""

    kube: FakeKube
    api: client.ApiClient
    core: client.CoreV1Api
    batch: client.BatchV1Api
    apps: client.AppsV1Api


@contextmanager
def cluster(tmp_path: Path, nodes: list[FakeNode]) -> Iterator[Cluster]:
    """A fake cluster of `nodes`; on exit, every JSON answer it gave passes `check` again."""
    with FakeKube(nodes) as kube:
        config_file = kube.kubeconfig(tmp_path / "kubeconfig")
        api = kubernetes.config.new_client_from_config(
            config_file=str(config_file), context="fake"
        )
        with api:
            yield Cluster(
                kube, api, client.CoreV1Api(api), client.BatchV1Api(api), client.AppsV1Api(api)
            )
        with kube.lock:
            answered = list(kube.answered)
        assert answered
        for model, body in answered:
            assert kube_models.check(body, model) == [], (model, body)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
    """Poll `probe` until it returns something truthy (bounded: a loaded machine is slow,
    a broken fake never gets there)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def condition(conditions: list[Any] | None, kind: str) -> Any:
    """The condition `kind` that is True, if any."""
    return next((c for c in conditions or [] if c.type == kind and c.status == "True"), None)


def job_pod_spec(command: list[str], **container: Any) -> client.V1PodTemplateSpec:
    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": "trainer"}),
        spec=client.V1PodSpec(
            restart_policy="Never",
            subdomain="trainers",
            containers=[
                client.V1Container(name="main", image="busybox:1.36", command=command, **container)
            ],
        ),
    )


def job_pods(c: Cluster, job: str) -> list[client.V1Pod]:
    return c.core.list_namespaced_pod(NS, label_selector=f"job-name={job}").items


def test_indexed_job_runs_each_index_with_its_env_and_completes(tmp_path: Path) -> None:
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        c.core.create_namespaced_secret(
            NS,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="creds"),
                string_data={"API_TOKEN": "s3cret", "REGION": "eu"},
            ),
        )
        script = (
            'echo "index=$JOB_COMPLETION_INDEX token=$API_TOKEN region=$REGION host=$HOSTNAME"'
        )
        template = job_pod_spec(
            ["sh", "-c", script],
            env=[
                client.V1EnvVar(
                    name="API_TOKEN",
                    value_from=client.V1EnvVarSource(
                        secret_key_ref=client.V1SecretKeySelector(name="creds", key="API_TOKEN")
                    ),
                ),
                client.V1EnvVar(
                    name="POD_NAME",
                    value_from=client.V1EnvVarSource(
                        field_ref=client.V1ObjectFieldSelector(field_path="metadata.name")
                    ),
                ),
            ],
            env_from=[client.V1EnvFromSource(secret_ref=client.V1SecretEnvSource(name="creds"))],
        )
        spec = client.V1JobSpec(
            completions=2,
            parallelism=2,
            completion_mode="Indexed",
            backoff_limit=0,
            template=template,
        )
        job = client.V1Job(metadata=client.V1ObjectMeta(name="train"), spec=spec)
        c.batch.create_namespaced_job(NS, job)

        done = wait_for(
            "the Job to complete",
            lambda: condition(
                c.batch.read_namespaced_job("train", NS).status.conditions, "Complete"
            ),
        )
        assert done.reason == "CompletionsReached"
        status = c.batch.read_namespaced_job_status("train", NS).status
        assert (status.succeeded, status.failed, status.active) == (2, None, None)
        assert status.completed_indexes == "0-1" and status.completion_time is not None

        pods = sorted(job_pods(c, "train"), key=lambda p: p.metadata.name)
        assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"]
        for index, pod in enumerate(pods):
            name = pod.metadata.name
            assert re.fullmatch(rf"train-{index}-[a-z0-9]{{5}}", name)
            key = "batch.kubernetes.io/job-completion-index"
            assert pod.metadata.labels[key] == pod.metadata.annotations[key] == str(index)
            assert pod.metadata.labels["app"] == "trainer"
            assert pod.metadata.labels["controller-uid"] == pod.metadata.owner_references[0].uid
            assert (pod.spec.hostname, pod.spec.subdomain) == (f"train-{index}", "trainers")
            terminated = pod.status.container_statuses[0].state.terminated
            assert (terminated.exit_code, terminated.reason) == (0, "Completed")
            env = c.kube.pod_env(name)
            assert env["JOB_COMPLETION_INDEX"] == str(index) and env["POD_NAME"] == name
            assert env["HOSTNAME"] == f"train-{index}"
            log = c.core.read_namespaced_pod_log(name, NS, container="main")
            assert log == f"index={index} token=s3cret region=eu host=train-{index}\n"
            assert c.core.read_namespaced_pod_log(name, NS, limit_bytes=7) == f"index={index}"


def test_a_failing_pod_fails_the_job_with_its_exit_code(tmp_path: Path) -> None:
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        spec = client.V1JobSpec(backoff_limit=0, template=job_pod_spec(["sh", "-c", "exit 3"]))
        c.batch.create_namespaced_job(
            NS, client.V1Job(metadata=client.V1ObjectMeta(name="bad"), spec=spec)
        )

        failed = wait_for(
            "the Job to fail",
            lambda: condition(c.batch.read_namespaced_job("bad", NS).status.conditions, "Failed"),
        )
        assert failed.reason == "BackoffLimitExceeded"
        job = c.batch.read_namespaced_job("bad", NS)
        assert job.status.failed == 1 and job.status.succeeded is None
        (pod,) = job_pods(c, "bad")
        assert re.fullmatch(r"bad-[a-z0-9]{5}", pod.metadata.name)
        assert pod.status.phase == "Failed"
        terminated = pod.status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason) == (3, "Error")

        # restartPolicy Never: the pod is not restarted, and no replacement is made
        assert pod.status.container_statuses[0].restart_count == 0
        assert len(job_pods(c, "bad")) == 1


def test_suspending_a_job_stops_its_pod_gracefully(tmp_path: Path) -> None:
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        loop = "trap 'echo term; exit 0' TERM; echo started; while :; do sleep 0.1; done"
        template = job_pod_spec(["sh", "-c", loop])
        template.spec.termination_grace_period_seconds = 60  # the SIGKILL would come far later
        spec = client.V1JobSpec(template=template)
        c.batch.create_namespaced_job(
            NS, client.V1Job(metadata=client.V1ObjectMeta(name="loop"), spec=spec)
        )
        (pod,) = wait_for("the pod to run", lambda: job_pods(c, "loop"))
        name = pod.metadata.name
        # its trap is set once it printed: only then does SIGTERM run it
        wait_for("the trap", lambda: "started" in c.core.read_namespaced_pod_log(name, NS))
        assert c.batch.read_namespaced_job("loop", NS).status.active == 1

        # a list body goes out as a JSON patch
        c.batch.patch_namespaced_job(
            "loop", NS, [{"op": "replace", "path": "/spec/suspend", "value": True}]
        )
        wait_for("the pod to be gone", lambda: not job_pods(c, "loop"))
        assert c.kube.pod_log(name) == "started\nterm\n"
        job = c.batch.read_namespaced_job("loop", NS)
        suspended = condition(job.status.conditions, "Suspended")
        assert suspended is not None and suspended.reason == "JobSuspended"
        assert job.status.active is None and job.status.failed is None

        # a dict body goes out as a strategic merge patch: resuming starts a new pod
        c.batch.patch_namespaced_job("loop", NS, {"spec": {"suspend": False}})
        (again,) = wait_for("a new pod", lambda: job_pods(c, "loop"))
        assert again.metadata.name != name
        patches = [r for r in c.kube.requests if r.method == "PATCH"]
        content_types = [r.headers.get("Content-Type") for r in patches]
        assert content_types == [
            "application/json-patch+json",
            "application/strategic-merge-patch+json",
        ]

        # Foreground: the Job stays (deletionTimestamp set) until its pod is gone
        c.batch.delete_namespaced_job("loop", NS, propagation_policy="Foreground")
        wait_for("the Job to be gone", lambda: not c.batch.list_namespaced_job(NS).items)
        assert not job_pods(c, "loop")


def test_a_pod_waits_for_gpus_until_a_gpu_node_is_ready(tmp_path: Path) -> None:
    nodes = [
        FakeNode("cpu-1", labels={"pool": "cpu"}),
        FakeNode("cpu-2", labels={"pool": "gpu"}),
        FakeNode("gpu-1", labels={"pool": "gpu"}, gpus=2, ready=False),
    ]
    with cluster(tmp_path, nodes) as c:
        allocatable = {n.metadata.name: n.status.allocatable for n in c.core.list_node().items}
        assert allocatable["gpu-1"]["nvidia.com/gpu"] == "2"
        assert "nvidia.com/gpu" not in allocatable["cpu-1"]
        gpu_1 = c.core.read_node("gpu-1")
        assert gpu_1.status.addresses[0].address == "127.0.0.1"
        assert condition(gpu_1.status.conditions, "Ready") is None

        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="cuda"),
            spec=client.V1PodSpec(
                restart_policy="Never",
                node_selector={"pool": "gpu"},
                containers=[
                    client.V1Container(
                        name="main",
                        image="cuda:12",
                        command=["sh", "-c", "echo on $NODE; while :; do sleep 0.1; done"],
                        env=[
                            client.V1EnvVar(
                                name="NODE",
                                value_from=client.V1EnvVarSource(
                                    field_ref=client.V1ObjectFieldSelector(
                                        field_path="spec.nodeName"
                                    )
                                ),
                            )
                        ],
                        resources=client.V1ResourceRequirements(
                            limits={"nvidia.com/gpu": "2", "cpu": "500m", "memory": "1Gi"}
                        ),
                    )
                ],
            ),
        )
        c.core.create_namespaced_pod(NS, pod)
        pending = c.core.read_namespaced_pod("cuda", NS)
        assert pending.status.phase == "Pending" and pending.spec.node_name is None
        scheduled = next(x for x in pending.status.conditions if x.type == "PodScheduled")
        assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
        assert scheduled.message == (
            "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, "
            "1 node(s) didn't match Pod's node affinity/selector, "
            "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }."
        )
        with pytest.raises(ApiException) as waiting:
            c.core.read_namespaced_pod_log("cuda", NS)
        assert waiting.value.status == 400
        assert (
            'container "main" in pod "cuda" is waiting to start'
            in json.loads(waiting.value.body)["message"]
        )

        c.kube.set_node_ready("gpu-1", True)
        running = wait_for(
            "the pod to run",
            lambda: (p := c.core.read_namespaced_pod("cuda", NS)).status.phase == "Running" and p,
        )
        assert running.spec.node_name == "gpu-1" and running.status.pod_ip == "127.0.0.1"
        wait_for("its log", lambda: c.core.read_namespaced_pod_log("cuda", NS) == "on gpu-1\n")

        # a node that stops being ready takes its pods down
        c.kube.set_node_ready("gpu-1", False)
        lost = c.core.read_namespaced_pod("cuda", NS)
        assert (lost.status.phase, lost.status.reason) == ("Failed", "NodeLost")
        assert lost.status.container_statuses[0].state.terminated.exit_code == 137


def _web_deployment(port: int, root: Path) -> client.V1Deployment:
    labels = {"app": "web"}
    container = client.V1Container(
        name="web",
        image="python:3.11",
        command=["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        working_dir=str(root),
        ports=[client.V1ContainerPort(name="http", container_port=port)],
    )
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web", labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[container]),
            ),
        ),
    )


def test_a_deployment_serves_through_the_service_proxy_and_scales_to_zero(
    tmp_path: Path,
) -> None:
    root = tmp_path / "site"
    root.mkdir()
    (root / "hello.txt").write_text("hello from the pod\n")
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        c.apps.create_namespaced_deployment(NS, _web_deployment(free_port(), root))
        service = client.V1Service(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1ServiceSpec(
                selector={"app": "web"},
                ports=[client.V1ServicePort(port=8080, target_port="http")],
            ),
        )
        c.core.create_namespaced_service(NS, service)
        (pod,) = c.core.list_namespaced_pod(NS, label_selector="app=web").items
        assert re.fullmatch(r"web-[a-z0-9]{10}-[a-z0-9]{5}", pod.metadata.name)

        def proxied() -> str | None:
            try:
                return c.core.connect_get_namespaced_service_proxy_with_path(
                    "web:8080", NS, "hello.txt"
                )
            except ApiException as e:
                assert e.status == 503, e  # until http.server listens
                return None

        assert wait_for("the proxy to answer", proxied) == "hello from the pod\n"
        deployment = c.apps.read_namespaced_deployment("web", NS)
        assert (deployment.status.ready_replicas, deployment.status.available_replicas) == (1, 1)

        method, url, headers, body, post = c.api.param_serialize(
            "GET",
            "/api/v1/namespaces/default/services/http:web:8080/proxy/hello.txt",
            query_params=[("q", "1")],
            auth_settings=["BearerToken"],
        )
        response = c.api.call_api(method, url, headers, body, post)
        response.read()
        assert response.status == 200 and response.data == b"hello from the pod\n"
        assert response.getheader("content-type") == "text/plain"
        # the upstream's status comes back as it is (http.server has no POST)
        with pytest.raises(ApiException) as no_post:
            c.core.connect_post_namespaced_service_proxy_with_path("web", NS, "hello.txt")
        assert no_post.value.status == 501

        c.apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 0}})
        wait_for(
            "the pod to go",
            lambda: not c.core.list_namespaced_pod(NS, label_selector="app=web").items,
        )
        assert c.apps.read_namespaced_deployment_scale("web", NS).spec.replicas == 0
        assert c.apps.read_namespaced_deployment("web", NS).status.ready_replicas is None
        with pytest.raises(ApiException) as gone:
            c.core.connect_get_namespaced_service_proxy_with_path("web:8080", NS, "hello.txt")
        assert gone.value.status == 503


def test_a_deployment_restarts_an_exited_container_in_place(tmp_path: Path) -> None:
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        deployment = _web_deployment(1, tmp_path)
        container = deployment.spec.template.spec.containers[0]
        container.command, container.ports = ["sh", "-c", "echo run; exit 4"], None
        c.apps.create_namespaced_deployment(NS, deployment)

        def restarted() -> client.V1ContainerStatus | None:
            pods = c.core.list_namespaced_pod(NS, label_selector="app=web").items
            statuses = pods[0].status.container_statuses if pods else None
            return statuses[0] if statuses and statuses[0].restart_count >= 2 else None

        status = wait_for("two restarts", restarted)
        assert status.last_state.terminated.exit_code == 4
        (pod,) = c.core.list_namespaced_pod(NS, label_selector="app=web").items
        assert pod.status.phase == "Running"
        c.apps.delete_namespaced_deployment("web", NS)
        wait_for("the pod to go", lambda: not c.core.list_namespaced_pod(NS).items)
        assert not c.kube.objects("ReplicaSet", NS)


def test_unknown_fields_answer_422_naming_them(tmp_path: Path) -> None:
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "typo"},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "command": ["true"],
                                "resourcez": {},
                            }
                        ],
                    }
                }
            },
        }
        request = c.api.param_serialize(
            "POST",
            "/apis/batch/v1/namespaces/default/jobs",
            header_params={"Content-Type": "application/json"},
            body=job,
            auth_settings=["BearerToken"],
        )
        response = c.api.call_api(*request)
        response.read()
        status = json.loads(response.data)
        assert response.status == 422 and status["reason"] == "Invalid"
        assert status["kind"] == "Status" and status["code"] == 422
        assert (
            "spec.template.spec.containers[0].resourcez: not a field of V1Container"
            in status["message"]
        )
        assert (
            status["details"]["causes"][0]["field"] == "spec.template.spec.containers[0].resourcez"
        )
        assert not c.kube.objects("Job", NS)

        # a patch's fields are checked too, and the API server's own rules
        del job["spec"]["template"]["spec"]["containers"][0]["resourcez"]
        c.batch.create_namespaced_job(NS, job)
        with pytest.raises(ApiException) as typo:
            c.batch.patch_namespaced_job("typo", NS, {"spec": {"suspendd": True}})
        assert typo.value.status == 422 and "spec.suspendd" in typo.value.body
        with pytest.raises(ApiException) as taken:
            c.batch.create_namespaced_job(NS, job)
        assert (
            taken.value.status == 409 and json.loads(taken.value.body)["reason"] == "AlreadyExists"
        )
        with pytest.raises(ApiException) as missing:
            c.core.read_namespace("nowhere")
        assert (
            missing.value.status == 404 and json.loads(missing.value.body)["reason"] == "NotFound"
        )


def test_selectors_patches_and_deletion_follow_the_api_conventions(tmp_path: Path) -> None:
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        c.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
        config = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="cfg"), data={"MODE": "fast"}
        )
        c.core.create_namespaced_config_map("team", config)
        claim_spec = client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"],
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
        )
        claim = client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name="data"), spec=claim_spec
        )
        assert (
            c.core.create_namespaced_persistent_volume_claim("team", claim).status.phase == "Bound"
        )
        for name, tier in (("a", "fe"), ("b", "be"), ("c", None)):
            labels = {"app": "x"} | ({"tier": tier} if tier else {})
            container = client.V1Container(
                name="main",
                image="busybox",
                command=["sh", "-c", "echo $(GREETING) $MODE"],
                env=[client.V1EnvVar(name="GREETING", value="hi-$(MODE)")],
                env_from=[
                    client.V1EnvFromSource(config_map_ref=client.V1ConfigMapEnvSource(name="cfg"))
                ],
            )
            pod = client.V1Pod(
                metadata=client.V1ObjectMeta(name=name, labels=labels),
                spec=client.V1PodSpec(restart_policy="Never", containers=[container]),
            )
            c.core.create_namespaced_pod("team", pod)

        def names(**query: Any) -> list[str]:
            return sorted(
                p.metadata.name for p in c.core.list_namespaced_pod("team", **query).items
            )

        assert names(label_selector="tier in (fe,be)") == ["a", "b"]
        assert names(label_selector="app=x,tier!=fe") == ["b", "c"]
        assert names(label_selector="!tier") == ["c"]
        assert names(field_selector="metadata.name=b") == ["b"]
        assert names(label_selector="app notin (x)") == []
        first = c.core.list_namespaced_pod("team", limit=2)
        rest = c.core.list_namespaced_pod("team", limit=2, _continue=first.metadata._continue)
        assert [p.metadata.name for p in first.items + rest.items] == ["a", "b", "c"]
        wait_for(
            "the pods to finish",
            lambda: names(field_selector="status.phase=Succeeded") == ["a", "b", "c"],
        )
        # $(VAR) in args and env values expands as the kubelet does
        assert c.core.read_namespaced_pod_log("a", "team") == "hi-fast fast\n"

        # optimistic concurrency: a replace with a stale resourceVersion is refused
        port = client.V1ServicePort(port=80)
        service = client.V1Service(
            metadata=client.V1ObjectMeta(name="svc"),
            spec=client.V1ServiceSpec(selector={"app": "x"}, ports=[port]),
        )
        stale = c.core.create_namespaced_service("team", service)
        c.core.patch_namespaced_service("svc", "team", {"metadata": {"labels": {"v": "2"}}})
        with pytest.raises(ApiException) as conflict:
            c.core.replace_namespaced_service("svc", "team", stale)
        assert (
            conflict.value.status == 409
            and json.loads(conflict.value.body)["reason"] == "Conflict"
        )

        # a Deployment's new template makes a new ReplicaSet, the old one goes to 0
        deployment = _web_deployment(1, tmp_path)
        deployment.spec.template.spec.containers[0].command = ["sleep", "60"]
        deployment.spec.template.spec.containers[0].ports = None
        c.apps.create_namespaced_deployment("team", deployment)
        patch = {
            "metadata": {"annotations": {"rev": "2"}},
            "spec": {"template": {"metadata": {"labels": {"rev": "2"}}}},
        }
        patched = c.apps.patch_namespaced_deployment(
            "web", "team", patch, _content_type="application/merge-patch+json"
        )
        assert patched.metadata.generation == 2 and patched.metadata.annotations == {"rev": "2"}
        sets = {
            r.metadata.name: r.spec.replicas
            for r in c.apps.list_namespaced_replica_set("team").items
        }
        assert sorted(sets.values()) == [0, 1] and len(sets) == 2
        wait_for(
            "the new pod alone",
            lambda: (
                [
                    p.metadata.labels.get("rev")
                    for p in c.core.list_namespaced_pod("team", label_selector="app=web").items
                ]
                == ["2"]
            ),
        )

        # deleting a Job without a propagation policy orphans its pods (batch/v1's default)
        spec = client.V1JobSpec(template=job_pod_spec(["sleep", "60"]))
        c.batch.create_namespaced_job(
            "team", client.V1Job(metadata=client.V1ObjectMeta(name="j"), spec=spec)
        )
        c.batch.delete_namespaced_job("j", "team")
        (orphan,) = c.core.list_namespaced_pod("team", label_selector="job-name=j").items
        assert orphan.metadata.owner_references is None and orphan.status.phase == "Running"


def test_requests_without_the_token_answer_401(tmp_path: Path) -> None:
    with cluster(tmp_path, [FakeNode("node-1")]) as c:
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"{c.kube.url}/api/v1/nodes", timeout=30)
        body = json.loads(anonymous.value.read())
        assert anonymous.value.code == 401
        assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)

        config = yaml.safe_load((tmp_path / "kubeconfig").read_text())
        config["users"][0]["user"]["token"] = "wrong"
        (tmp_path / "wrong").write_text(yaml.safe_dump(config))
        with kubernetes.config.new_client_from_config(str(tmp_path / "wrong")) as api:
            with pytest.raises(ApiException) as wrong:
                client.CoreV1Api(api).list_node()
        assert wrong.value.status == 401
        assert json.loads(wrong.value.body)["message"] == "Unauthorized"
        assert [r.path for r in c.kube.requests][-2:] == ["/api/v1/nodes", "/api/v1/nodes"]


def test_check_rejects_a_misspelled_nested_field() -> None:
    job = client.ApiClient().sanitize_for_serialization(
        client.V1Job(
            metadata=client.V1ObjectMeta(name="j"),
            spec=client.V1JobSpec(template=job_pod_spec(["true"])),
        )
    )
    assert kube_models.check(job, "V1Job") == []
    job["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {"limits": {}}
    job["spec"]["backoffLimit"] = "6"
    job["metadata"]["labels"] = {"a": 1}
    assert sorted(kube_models.check(job, "V1Job")) == [
        "metadata.labels['a']: expected str, got int 1",
        "spec.backoffLimit: expected int, got string '6'",
        "spec.template.spec.containers[0].resourcez: not a field of V1Container",
    ]
    del job["spec"]["template"]["spec"]["containers"][0]["name"]
    problems = kube_models.check(job, "V1Job")
    assert "spec.template.spec.containers[0].name: required by V1Container, missing" in problems
    with pytest.raises(AssertionError, match="resourcez"):
        kube_models.require_valid(job, "V1Job")
