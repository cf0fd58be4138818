"""Defaults in the fake Kubernetes API (tests/infra/fake_kube.py), as the API server fills
them in before validating: a pod spec's restartPolicy, grace period, DNS policy, pull policy
and default tolerations; a Job's completions, parallelism, backoffLimit, completion mode
and (once it has a uid) selector and pod labels; a Deployment's replicas and strategy; a
Service's clusterIP and target ports; a Secret's stringData folded into data; a claim's
storage class.
"""

from __future__ import annotations

import base64
import hashlib
import json

from tests.infra.fake_kube_store import SAFE_ALPHABET, Obj


def default_pod_spec(spec: Obj) -> None:
    """The API server's defaults for a pod spec (a Pod's, or a template's)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for container in spec.get("containers") or []:
        image = str(container.get("image") or "")
        untagged = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if untagged else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        for port in container.get("ports") or []:
            port.setdefault("protocol", "TCP")


def _default_pod(obj: Obj) -> None:
    default_pod_spec(obj.setdefault("spec", {}))
    # DefaultTolerationSeconds admission: evicted 5 minutes after a node is lost (the fake
    # fails the pods of a lost node at once, see fake_kube.py)
    tolerations = obj["spec"].setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key for t in tolerations):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )


def _default_job(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))


def label_job(obj: Obj) -> None:
    """Once a Job has its uid: its generated selector and the labels its pods carry."""
    meta, spec = obj["metadata"], obj["spec"]
    uid, name = meta["uid"], meta["name"]
    labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
    labels.update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
    )
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}


def _default_deployment(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault(
        "strategy",
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
    )
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))


_cluster_ips = iter(range(10, 1 << 16))


def _default_service(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if not spec.get("clusterIP"):
        n = next(_cluster_ips)
        spec["clusterIP"] = f"10.96.{n >> 8}.{n & 255}"
    spec.setdefault("clusterIPs", [spec["clusterIP"]])
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    obj["status"] = {"loadBalancer": {}}


def _default_secret(obj: Obj) -> None:
    obj.setdefault("type", "Opaque")
    # stringData is write-only: merged into data on write, never read back
    for key, value in (obj.pop("stringData", None) or {}).items():
        obj.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode()


def _default_pvc(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("volumeMode", "Filesystem")
    spec.setdefault("storageClassName", "standard")


def _default_namespace(obj: Obj) -> None:
    name = obj["metadata"].get("name", "")
    obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    obj["spec"] = {"finalizers": ["kubernetes"]}
    obj["status"] = {"phase": "Active"}


DEFAULTS = {
    "Pod": _default_pod,
    "Job": _default_job,
    "Deployment": _default_deployment,
    "Service": _default_service,
    "Secret": _default_secret,
    "PersistentVolumeClaim": _default_pvc,
    "Namespace": _default_namespace,
}


def template_hash(template: Obj) -> str:
    """A pod template's `pod-template-hash` (10 characters of the safe alphabet)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(SAFE_ALPHABET[b % len(SAFE_ALPHABET)] for b in digest[:10])


def qos_class(spec: Obj) -> str:
    """A pod spec's QoS class: BestEffort, Guaranteed (cpu and memory limits equal to
    requests), else Burstable."""
    containers = spec.get("containers") or []
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    for r in resources:
        limits, requests = r.get("limits") or {}, r.get("requests") or {}
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                return "Burstable"
    return "Guaranteed"
