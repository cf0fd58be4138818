"""A Kubernetes fleet end to end, through the CLI and the official client, on the fake API
server (tests/infra/fake_kube.py: what it cannot show is in its module doc): plan shows the
node group and what each pod asks, apply creates the Job or Deployment, `ps` and `logs` read
the pods, watch's proxy reaches a service through the API server, destroy leaves nothing."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_service_proxy import until, watching  # noqa: F401 - fixture
from tests.infra.fake_kube import FakeKube, FakeNode

GPU_LABEL = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
PRINT_WIRING = (
    'echo "rank=$DSTACK_NODE_RANK of=$DSTACK_NODES_NUM master=$DSTACK_MASTER_NODE_IP'
    ' ips=$(echo $DSTACK_NODES_IPS | tr " " ,) job=$DSTACK_JOB_ID token=${TOKEN:+set}"'
)
SMALL = "{cpu: 1.., memory: 0.2GB..}"


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    nodes = [
        FakeNode("cpu-1", cpu="2", memory="4Gi"),
        FakeNode("cpu-2", cpu="2", memory="4Gi"),
        FakeNode("gpu-1", labels=GPU_LABEL, cpu="8", memory="16Gi", gpus=2),
        FakeNode("gpu-2", labels=GPU_LABEL, cpu="8", memory="16Gi", gpus=2),
    ]
    with FakeKube(nodes) as fake:
        yield fake


def kube_project(tmp_path: Path, kube: FakeKube) -> Path:
    """A project whose backend is the fake cluster, with a Kubernetes fleet `cluster`."""
    project = tmp_path / "project"
    (project / ".dstack").mkdir(parents=True)
    config = kube.kubeconfig(tmp_path / "kubeconfig", context="fake", namespace="ml")
    (project / ".dstack" / "backends.yml").write_text(
        "backends:\n"
        "  - type: kubernetes\n"
        "    clusters:\n"
        "      - name: prod\n"
        f"        kubeconfig: {config}\n"
        "        context: fake\n"
        "        namespace: default\n"
    )
    (project / "fleet.dstack.yml").write_text(
        "type: fleet\nname: cluster\nbackends: [kubernetes]\n"
    )
    return project


def task(name: str, nodes: int, commands: list[str], resources: str, extra: str = "") -> str:
    return (
        f"type: task\nname: {name}\nnodes: {nodes}\nfleets: [cluster]\n"
        f"commands: {json.dumps(commands)}\nstop_duration: 2s\nresources: {resources}\n{extra}"
    )


def ours(kube: FakeKube, kind: str) -> list[str]:
    return sorted(
        o["metadata"]["name"]
        for o in kube.objects(kind, "default")
        if (o["metadata"].get("labels") or {}).get("dstack-plan/managed") == "true"
    )


def test_a_two_node_task_a_gpu_plan_and_offers_on_a_kubernetes_fleet(
    dstack: Dstack, tmp_path: Path, kube: FakeKube
) -> None:
    project = kube_project(tmp_path, kube)
    (project / ".dstack" / "secrets.yml").write_text("TOKEN: s3cret-value\n")
    (project / ".dstack" / "secrets.yml").chmod(0o600)
    (project / "ranks.dstack.yml").write_text(
        task("ranks", 2, [PRINT_WIRING], SMALL, "env: {TOKEN: '${{ secrets.TOKEN }}'}\n")
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    row = wait_for_status(dstack, "task.ranks", {"done", "failed"}, timeout=120)
    assert row["status"] == "done", row
    resources = state(project)["resources"]
    fleet = resources["fleet.cluster"]
    assert (fleet["provider"], fleet["status"]) == ("kubernetes", "active")
    groups = {g["name"]: g for g in fleet["attributes"]["node_groups"]}
    assert (groups["NVIDIA-A100-SXM4-80GB"]["gpus"], groups["cpu"]["ready"]) == (2, 2)
    jobs = resources["task.ranks"]["attributes"]["jobs"]
    assert [(j["node"], j["host"]) for j in jobs] == [(0, "prod"), (1, "prod")]
    (name,) = ours(kube, "Job")
    ips = f"{name}-0.{name}.default.svc,{name}-1.{name}.default.svc"
    for node in (0, 1):
        logs = dstack("logs", "ranks", "--job", str(node))
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == (
            f"rank={node} of=2 master={name}-0.{name}.default.svc ips={ips} "
            f"job={jobs[node]['id']} token=set\n"
        )
    # the secret's value went to a Secret the pods read, never into a pod or Job spec (nor,
    # the `dstack` fixture checks, into state or output)
    (job,) = [j for j in kube.objects("Job", "default") if j["metadata"]["name"] == name]
    assert "s3cret-value" not in json.dumps(job)
    assert all("s3cret-value" not in json.dumps(p) for p in kube.objects("Pod", "default"))

    # `dstack offer` lists the node groups: what one node has, how many are ready
    offered = dstack("offer", "--gpu", "A100:2", "--cpu", "1..", "--memory", "0.2GB..", "--json")
    assert offered.returncode == 0, offered.stderr
    view = json.loads(offered.stdout)
    rows = [r for r in view["offers"] if r["provider"] == "kubernetes"]
    assert [(r["fleet"], r["host"], r["availability"]) for r in rows] == [
        ("cluster", "prod/NVIDIA-A100-SXM4-80GB (2 of 2 nodes ready)", "available")
    ]
    assert [g["name"] for g in rows[0]["gpus"]] == ["NVIDIA-A100-SXM4-80GB"] * 2
    only = dstack(
        "offer", "--backend", "kubernetes", "--cpu", "1..", "--memory", "0.2GB..", "--json"
    )
    assert [r["host"] for r in json.loads(only.stdout)["offers"]] == [
        "prod/cpu (2 of 2 nodes ready)"
    ]

    # the plan says where a GPU run goes and what each pod asks
    (project / "gpus.dstack.yml").write_text(
        task("gpus", 1, ["sleep 300"], "{cpu: 2.., memory: 1GB.., gpu: A100:2}")
    )
    planned = dstack("plan")
    assert planned.returncode == 0, planned.stderr
    assert "Kubernetes prod (namespace default), nodes NVIDIA-A100-SXM4-80GB" in planned.stdout
    assert "nvidia.com/gpu: 2" in planned.stdout
    assert "on nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB" in planned.stdout
    (project / "big.dstack.yml").write_text(task("big", 3, ["true"], SMALL))
    refused = dstack("plan")
    assert refused.returncode == 1
    assert "task.big cannot run on fleet cluster" in refused.stderr
    assert "cpu: has 2 ready node(s), the run needs 3" in refused.stderr
    (project / "big.dstack.yml").unlink()

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.gpus", {"running"}, timeout=120)
    pods = [
        p for p in kube.objects("Pod", "default") if p["metadata"]["name"].startswith("dp-gpus-")
    ]
    assert [p["spec"]["nodeName"] for p in pods] in (["gpu-1"], ["gpu-2"])

    stopped = dstack("stop", "-y", "gpus")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert wait_for_status(dstack, "task.gpus", {"terminated"}, timeout=120)
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    for kind in ("Job", "Deployment", "Pod", "Service", "Secret"):
        assert ours(kube, kind) == [], kind


def test_a_failed_pod_fails_the_run_with_its_exit_code_and_a_lost_node_with_the_reason(
    dstack: Dstack, tmp_path: Path, kube: FakeKube
) -> None:
    project = kube_project(tmp_path, kube)
    (project / "bad.dstack.yml").write_text(task("bad", 1, ["echo oops; exit 3"], SMALL))
    (project / "long.dstack.yml").write_text(
        task("long", 1, ["sleep 600"], "{cpu: 1.., memory: 0.2GB.., gpu: A100:1}")
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    bad = wait_for_status(dstack, "task.bad", {"failed"}, timeout=120)
    assert "exited with code 3" in json.dumps(bad)
    assert dstack("logs", "bad").stdout == "oops\n"
    wait_for_status(dstack, "task.long", {"running"}, timeout=120)
    (pod,) = [
        p for p in kube.objects("Pod", "default") if p["metadata"]["name"].startswith("dp-long-")
    ]
    kube.set_node_ready(pod["spec"]["nodeName"], False)
    lost = wait_for_status(dstack, "task.long", {"failed"}, timeout=120)
    assert "NodeLost" in json.dumps(lost) or "node lost" in json.dumps(lost)
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert ours(kube, "Job") == []


def _free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return int(listener.getsockname()[1])


def test_a_service_on_kubernetes_is_served_by_watchs_proxy_through_the_api_server(
    dstack: Dstack,
    tmp_path: Path,
    kube: FakeKube,
    watching: Any,  # noqa: F811
) -> None:
    project = kube_project(tmp_path, kube)
    port = _free_port()  # the fake's pods share this machine's ports
    (project / "web.dstack.yml").write_text(
        f"type: service\nname: web\nfleets: [cluster]\nport: {port}\n"
        f"stop_duration: 1s\nauth: false\nresources: {SMALL}\n"
        "commands:\n  - mkdir -p www && echo served-by-$DSTACK_REPLICA_NUM > www/index.html\n"
        f"  - exec python3 -m http.server {port} --bind 127.0.0.1 --directory www\n"
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "service.web", {"running"}, timeout=120)
    (name,) = ours(kube, "Deployment")
    assert ours(kube, "Service") == [name]
    url = f"{watching()}/proxy/services/web/"
    assert until(lambda: httpx.get(url, timeout=10).text.strip() == "served-by-0", timeout=90)
    assert kube.sent("GET", f"/services/{name}:{port}/proxy/")
    watching.stop()
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    for kind in ("Deployment", "Pod", "Service", "Secret"):
        assert ours(kube, kind) == [], kind


def test_an_api_server_that_does_not_answer_leaves_the_runs_as_they_were(
    dstack: Dstack, tmp_path: Path, kube: FakeKube
) -> None:
    project = kube_project(tmp_path, kube)
    (project / "long.dstack.yml").write_text(task("long", 1, ["sleep 600"], SMALL))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.long", {"running"}, timeout=120)
    config = tmp_path / "kubeconfig"
    kept = config.read_text()
    # the server's port now refuses: the same kubeconfig pointing at a closed port
    config.write_text(kept.replace(kube.url, f"http://127.0.0.1:{_free_port()}"))
    planned = dstack("plan", "--detailed-exitcode")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    (row,) = json.loads(dstack("ps", "--json").stdout)
    recorded = state(project)["resources"]["task.long"]["status"]
    assert (row["address"], row["status"]) == ("task.long", recorded)  # as last recorded
    assert "cannot reach the cluster" in row["error"]
    assert [p["status"]["phase"] for p in kube.objects("Pod", "default")] == ["Running"]
    config.write_text(kept)
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert ours(kube, "Pod") == []


def test_a_volume_is_a_persistent_volume_claim_the_pods_mount(
    dstack: Dstack, tmp_path: Path, kube: FakeKube
) -> None:
    project = kube_project(tmp_path, kube)
    (project / "ckpt.dstack.yml").write_text(
        "type: volume\nname: ckpt\nbackend: kubernetes\nsize: 10GB\nstorage_class_name: fast\n"
    )
    (project / "train.dstack.yml").write_text(
        task("train", 2, ["echo $DSTACK_NODE_RANK"], SMALL, "volumes: [ckpt:/ckpt]\n")
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (claim,) = kube.objects("PersistentVolumeClaim", "default")
    assert claim["metadata"]["name"] == "dp-ckpt"
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"] == {"storage": "10Gi"}
    volume = state(project)["resources"]["volume.ckpt"]
    assert (volume["provider"], volume["attributes"]["id"]) == ("kubernetes", "dp-ckpt")
    wait_for_status(dstack, "task.train", {"done"}, timeout=120)
    (job,) = [
        j for j in kube.objects("Job", "default") if j["metadata"]["name"].startswith("dp-train-")
    ]
    pod = job["spec"]["template"]["spec"]
    assert {"name": "claim-0", "persistentVolumeClaim": {"claimName": "dp-ckpt"}} in pod["volumes"]
    assert {"name": "claim-0", "mountPath": "/ckpt"} in pod["containers"][0]["volumeMounts"]
    assert dstack("plan", "--detailed-exitcode").returncode == 0  # refresh agrees: no change

    # a node's directory is no claim: refused at plan time, saying what a pod mounts
    (project / "host.dstack.yml").write_text(
        task("host", 1, ["true"], SMALL, "volumes: [/data:/data]\n")
    )
    refused = dstack("plan")
    assert refused.returncode == 1
    assert "a Kubernetes pod mounts PersistentVolumeClaims" in refused.stderr
    (project / "host.dstack.yml").unlink()

    destroyed = dstack("destroy", "-y", "--allow-destroy", "volume.ckpt")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert kube.objects("PersistentVolumeClaim", "default") == []
    assert ours(kube, "Job") == []
