"""A fake Kubernetes cluster for the Kubernetes backend's tests: an HTTP server on 127.0.0.1
speaking the REST API the official `kubernetes` client calls, with small controllers that
make the objects behave (a Job makes pods, pods run as local processes).

    with FakeKube([FakeNode("cpu-1"), FakeNode("gpu-1", gpus=2)]) as kube:
        api = kubernetes.config.new_client_from_config(str(kube.kubeconfig(tmp / "kc")), "fake")
        kubernetes.client.BatchV1Api(api).create_namespaced_job("default", job)

Served (core `/api/v1`, `/apis/batch/v1`, `/apis/apps/v1`): namespaces (get, list, create);
nodes (get, list); pods (create, get, list, delete, `log`, patch of metadata only);
secrets, configmaps, services,
persistentvolumeclaims (create, get, list, replace, patch, delete; a claim is `Bound` at
once); jobs and deployments (create, get, list, replace, patch, delete, `status`;
deployments' `scale`); replicasets (get, list: the Deployment controller's); the service
proxy (`/api/v1/namespaces/{ns}/services/{name}[:{port}]/proxy/{path}`, any method, to a
ready pod the Service selects); `/version`. Lists take `labelSelector`, `fieldSelector`,
`limit` and `continue`; collections take DELETE. Patches are JSON patch (a list body),
JSON merge patch and strategic merge patch (the client sends the latter for a dict body).
Deletion is graceful: a pod gets deletionTimestamp, SIGTERM to its main process, SIGKILL to
its process group after the grace period, and is gone once its process ended; owners
cascade per propagationPolicy (Foreground keeps the owner until its dependents are gone).
Status counts are left out when 0, as Go's omitempty leaves them out of a real answer
(`readyReplicas`, a Job's `active`, `succeeded`, `failed`): the client reads None.

The kubelet is `fake_kube_pods.py`, the controllers `fake_kube_controllers.py` (with
`fake_kube_jobs.py` and `fake_kube_scheduler.py`), admission `fake_kube_admit.py`.
The cluster settles synchronously: a request returns once every controller has acted on
it (a created Job's pods exist and have started), and each process exit is acted on by its
waiter thread, so tests wait on outcomes with bounded polls, never on time.

Validated: every request needs `Authorization: Bearer <token>` (else 401). Every body is
checked against the client's model of its kind (`tests/infra/kube_models.py`: unknown
fields, JSON types, required fields), then defaulted and validated as the API server does
the checks a backend is most likely to trip (`fake_kube_admit.py`); problems answer 422
`Invalid` naming the field path. Every JSON answer is checked against its model too: a
wrong one answers 500 and is kept in `errors`, and leaving the `with` block raises.

What the fake cannot show, compared with a real cluster:
- Images are never pulled or run: a container runs its `command` + `args` on this machine
  (no entrypoint without a command: the pod waits with CreateContainerConfigError). No
  isolation: no namespaces, cgroups, volumes, volume mounts, security contexts or limits
  enforcement; requests and limits only count for scheduling.
- One container per pod (more, or init containers, answer 422); no probes (a running
  container is ready); no exec, attach, port-forward, watch, log `follow` streaming,
  dryRun or server-side apply.
- Networking: every pod and node has the address 127.0.0.1, so pods share this machine's
  ports; no DNS (a pod's `hostname`/`subdomain` are set but resolve nowhere), no cluster
  IPs that route (the proxy is the way in), no service environment variables.
- Scheduling is first fit over the nodes in their order: nodeSelector, required node
  affinity, cpu/memory/pods/extended resources (limits standing in for absent requests),
  Ready and unschedulable nodes. No taints or tolerations beyond not-ready, no pod
  affinity, topology spread, priorities or preemption; the Unschedulable message has the
  scheduler's form (reasons counted and sorted) without its "preemption: ..." sentence.
- A node set not Ready fails its pods at once (a real cluster evicts them after 5 minutes):
  the processes get SIGKILL, the pods phase `Failed` with reason `NodeLost`, their
  container terminated with exit code 137 (reason `Error`, message `node lost`).
- Restarts in place (restartPolicy Always, or OnFailure after a failure) back off 0.05 s
  doubling to 1 s, not 10 s to 5 min. A Job replaces a failed pod at once (no back-off
  delay); pods it stops (suspension, failure, completion) are not counted; pods deleted by
  someone else are counted by how their process ended.
- Jobs: no podFailurePolicy, successPolicy, backoffLimitPerIndex or pod finalizers;
  deleting a Job with no propagationPolicy orphans its pods, as batch/v1 does.
- Deployments roll out by scaling the old ReplicaSet to 0 and the new one up at once
  (maxSurge and maxUnavailable are not honoured), and no revision history is kept.
- Request bodies are stricter than a real server's: an unknown field answers 422 (a real
  one warns, or with `fieldValidation=Strict` answers 400 `strict decoding error`).
"""

from __future__ import annotations

import copy
import http.client
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote

import yaml

from tests.infra import kube_models
from tests.infra.fake_kube_api import Answer, Api
from tests.infra.fake_kube_controllers import Controllers
from tests.infra.fake_kube_objects import condition_true, set_condition
from tests.infra.fake_kube_pods import POD_IP, Kubelet
from tests.infra.fake_kube_store import BY_KIND, KubeError, Obj, Store, now_rfc3339
from tests.infra.rest_server import Reply, Request, RestApp, RestServer

_PROXY = re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/]+)/proxy(/.*)?$")
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "content-length", "host", "authorization",
}  # fmt: skip


@dataclass
class FakeNode:
    """A node of the fake cluster: its labels, allocatable resources and state."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    cpu: str = "4"
    memory: str = "8Gi"
    gpus: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    ready: bool = True
    unschedulable: bool = False


class FakeKube(RestApp):
    """The fake cluster: its API server on 127.0.0.1 (a random port) while in a `with`
    block, which stops it and kills every pod process on exit."""

    handle_under_lock = False  # the service proxy waits on pods: it takes the lock itself

    def __init__(self, nodes: list[FakeNode], token: str | None = None) -> None:
        super().__init__()
        self.token = token or secrets.token_urlsafe(24)
        self.workdir = Path(tempfile.mkdtemp(prefix="fake-kube-"))
        self.store = Store()
        self.kubelet = Kubelet(self.store, self.lock, self.workdir, self._settle)
        self.controllers = Controllers(self.store, self.kubelet, self.lock)
        self.api = Api(self.store, self.controllers, self.kubelet)
        self._server: RestServer | None = None
        self.answered: list[tuple[str, Any]] = []
        """(model, body) of every JSON answer, oldest first: tests may check them again."""
        with self.lock:
            for namespace in ("default", "kube-system"):
                self.store.create(BY_KIND["Namespace"], _namespace(namespace), "")
            for node in nodes:
                self.store.create(BY_KIND["Node"], _node(node), "")

    # -- lifecycle

    def __enter__(self) -> FakeKube:
        self._server = RestServer(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if exc_type is None and self.errors:
            raise AssertionError("fake_kube answered wrongly:\n  " + "\n  ".join(self.errors))

    def stop(self) -> None:
        """Stop serving, kill every pod's process group and remove the pods' files."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        with self.lock:
            self.controllers.stop()
            waiters = self.kubelet.stop()
        for waiter in waiters:
            waiter.join(timeout=30)
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT` once serving."""
        return self.base_url

    def kubeconfig(self, path: Path, context: str = "fake", namespace: str = "default") -> Path:
        """Write a kubeconfig for this cluster (user: the bearer token) to `path`, loadable
        with `kubernetes.config.new_client_from_config(config_file=str(path), context=...)`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake-cluster", "cluster": {"server": self.url}}],
            "users": [{"name": "fake-user", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": context,
                    "context": {
                        "cluster": "fake-cluster",
                        "user": "fake-user",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": context,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        return path

    # -- introspection for tests (and `requests`: every request, with its method, path,
    # query and decoded body, oldest first)

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """Copies of the stored objects of `kind` (`Pod`, or the plural `pods`), in
        `namespace` unless None, oldest first."""
        res = BY_KIND.get(kind) or next(r for r in BY_KIND.values() if r.plural == kind)
        with self.lock:
            return [copy.deepcopy(o) for o in self.store.items(res.kind, namespace)]

    def set_node_ready(self, name: str, ready: bool) -> None:
        """Mark a node Ready or not: not Ready fails its pods (`NodeLost`); Ready lets
        pending pods be scheduled on it."""
        with self.lock:
            node = self.store.must_get(BY_KIND["Node"], "", name)
            _set_node_ready(node, ready)
            self.store.put(node)
            if not ready:
                self.kubelet.node_lost(name)
            self._settle()

    def pod_env(self, pod_name: str, namespace: str = "default") -> dict[str, str]:
        """The environment the pod's process last started with."""
        with self.lock:
            return dict(self.kubelet.envs[(namespace, pod_name)])

    def pod_log(self, pod_name: str, namespace: str = "default") -> str:
        """What the pod's process (its last run) wrote so far, also once the pod is gone."""
        with self.lock:
            runs = list(self.kubelet.logs.get((namespace, pod_name), []))
        return runs[-1].path.read_text(errors="replace") if runs else ""

    # -- serving

    def handle(self, request: Request) -> Reply:
        """Answer one request: 401 without the token, the service proxy, else the API."""
        path = unquote(request.path)
        if not self._authorized(request):
            error = KubeError(401, "Unauthorized", "Unauthorized")
            return self._reply(Answer(401, error.status(), "V1Status"))
        try:
            if m := _PROXY.match(path):
                return self._proxy(request, m)
            with self.lock:
                answer = self.api.serve(request, path)
        except KubeError as e:
            answer = Answer(e.code, e.status(), "V1Status")
        return self._reply(answer)

    def _authorized(self, request: Request) -> bool:
        header = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        return secrets.compare_digest(header, f"Bearer {self.token}")

    def _reply(self, answer: Answer) -> Reply:
        if answer.raw is not None:
            return Reply(answer.status, raw=answer.raw, content_type=answer.content_type)
        problems = kube_models.check(answer.body, answer.model) if answer.model else []
        with self.lock:
            self.answered.append((answer.model, answer.body))
        if problems:
            # the fake's own mistake: the test fails loudly (500 now, AssertionError on exit)
            message = f"fake_kube answered an invalid {answer.model}: " + "; ".join(problems)
            with self.lock:
                self.errors.append(message)
            body = KubeError(500, "InternalError", message).status()
            return Reply(500, body)
        return Reply(answer.status, answer.body)

    def _settle(self) -> None:
        self.controllers.settle()

    def _proxy(self, request: Request, m: re.Match[str]) -> Reply:
        namespace, target, path = m.group(1), m.group(2), m.group(3) or "/"
        parts = target.split(":")
        scheme = parts[0] if len(parts) == 3 else "http"
        name, port = (parts[1:] if len(parts) == 3 else [*parts, ""])[:2]
        if scheme != "http":
            raise KubeError(400, "BadRequest", f"fake_kube proxies plain http only, not {scheme}")
        with self.lock:
            upstream_port = self._endpoint(namespace, name, port)
        query = f"?{request.query_string}" if request.query_string else ""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        connection = http.client.HTTPConnection(POD_IP, upstream_port, timeout=60)
        try:
            connection.request(
                request.method,
                quote(path, safe="/:@!$&'()*+,;=-._~") + query,
                body=request.raw or None,
                headers=headers,
            )
            response = connection.getresponse()
            data = response.read()
        except OSError as e:
            message = f"error trying to reach service: dial tcp {POD_IP}:{upstream_port}: {e}"
            raise KubeError(503, "ServiceUnavailable", message) from e
        finally:
            connection.close()
        kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
        return Reply(response.status, raw=data, headers=kept)

    def _endpoint(self, namespace: str, name: str, port: str) -> int:
        """The local port of a ready pod behind the Service's `port` (a name or number)."""
        service = self.store.must_get(BY_KIND["Service"], namespace, name)
        ports = service["spec"].get("ports") or []
        chosen = next(
            (p for p in ports if port and port in (p.get("name"), str(p["port"]))),
            ports[0] if ports and not port else None,
        )
        unavailable = KubeError(
            503, "ServiceUnavailable", f'no endpoints available for service "{name}"'
        )
        selector = service["spec"].get("selector")
        if chosen is None or not selector:
            raise unavailable
        for pod in self.store.items("Pod", namespace):
            labels = pod["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            if pod["metadata"].get("deletionTimestamp") or not condition_true(
                pod["status"], "Ready"
            ):
                continue
            target = chosen.get("targetPort", chosen["port"])
            if isinstance(target, int) or str(target).isdigit():
                return int(target)
            for container_port in pod["spec"]["containers"][0].get("ports") or []:
                if container_port.get("name") == target:
                    return int(container_port["containerPort"])
        raise unavailable


def _namespace(name: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def _node(node: FakeNode) -> Obj:
    capacity = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }
    if node.gpus > 0:
        capacity[node.gpu_resource] = str(node.gpus)
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
    } | node.labels
    now = now_rfc3339()
    obj: Obj = {
        "metadata": {"name": node.name, "labels": labels},
        "spec": {"unschedulable": True} if node.unschedulable else {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [
                {"type": "InternalIP", "address": POD_IP},
                {"type": "Hostname", "address": node.name},
            ],
            "conditions": [
                {
                    "type": kind,
                    "status": "False",
                    "reason": f"KubeletHas{reason}",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
                for kind, reason in (
                    ("MemoryPressure", "SufficientMemory"),
                    ("DiskPressure", "NoDiskPressure"),
                    ("PIDPressure", "SufficientPID"),
                )
            ],  # fmt: skip
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": node.name,
                "containerRuntimeVersion": "fake://1.0",
                "kernelVersion": "6.0.0-fake",
                "kubeProxyVersion": "v1.33.0-fake",
                "kubeletVersion": "v1.33.0-fake",
                "machineID": node.name,
                "operatingSystem": "linux",
                "osImage": "fake_kube local processes",
                "systemUUID": node.name,
            },
        },
    }
    _set_node_ready(obj, node.ready)
    return obj


def _set_node_ready(node: Obj, ready: bool) -> None:
    set_condition(
        node["status"]["conditions"],
        "Ready",
        "True" if ready else "False",
        "KubeletReady" if ready else "KubeletNotReady",
        "kubelet is posting ready status" if ready else "fake_kube: node set not ready",
    )
    # the node lifecycle controller's taints on a node that is not ready
    taints = []
    if node["spec"].get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    if not ready:
        for effect in ("NoSchedule", "NoExecute"):
            taints.append({"key": "node.kubernetes.io/not-ready", "effect": effect})
    if taints:
        node["spec"]["taints"] = taints
    else:
        node["spec"].pop("taints", None)
