"""The fake Kubernetes cluster's scheduler (tests/infra/fake_kube.py): first fit.

A pod goes to the first node, in the nodes' order, that is schedulable and Ready, matches
its nodeSelector and required node affinity, and has the pod's requests (limits standing in
for absent ones) left of its allocatable after the pods already placed there. Otherwise the
pod stays Pending with PodScheduled False, reason Unschedulable, and the scheduler's message
(`0/3 nodes are available: 1 Insufficient nvidia.com/gpu, ...`, reasons counted over the
nodes and sorted). Pending pods are retried on every settle of the controllers, so they
start as soon as a pod ends or a node becomes Ready.
"""

from __future__ import annotations

from collections import Counter

from tests.infra.fake_kube_objects import (
    TERMINAL,
    condition_true,
    live,
    selector_matches,
    set_condition,
)
from tests.infra.fake_kube_store import Obj, Store, container_requests, parse_quantity


def schedule(store: Store) -> bool:
    """Place every pending pod on the first node it fits (see `fake_kube.py`), or mark it
    Unschedulable with the scheduler's message; whether any pod changed."""
    nodes = store.items("Node")
    pods = store.items("Pod")
    used: dict[str, Counter[str]] = {n["metadata"]["name"]: Counter() for n in nodes}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node in used and pod["status"].get("phase") not in TERMINAL:
            used[node].update(_needs(pod))
    changed = False
    for pod in pods:
        if pod["spec"].get("nodeName") or not live(pod):
            continue
        need = _needs(pod)
        histogram: Counter[str] = Counter()
        for node in nodes:
            reasons = _unfit(node, pod, need, used[node["metadata"]["name"]])
            if not reasons:
                name = node["metadata"]["name"]
                pod["spec"]["nodeName"] = name
                used[name].update(need)
                set_condition(pod["status"].setdefault("conditions", []), "PodScheduled", "True")
                break
            histogram.update(reasons)
        else:
            reasons_text = ", ".join(sorted(f"{n} {r}" for r, n in histogram.items()))
            message = (
                f"0/{len(nodes)} nodes are available: {reasons_text}."
                if nodes
                else "no nodes available to schedule pods"
            )
            conditions = pod["status"].setdefault("conditions", [])
            if not set_condition(conditions, "PodScheduled", "False", "Unschedulable", message):
                continue
        store.put(pod)
        changed = True
    return changed


def _needs(pod: Obj) -> Counter[str]:
    needs: Counter[str] = Counter({"pods": 1})
    for name, amount in container_requests(pod["spec"]["containers"]).items():
        needs[name] += amount  # type: ignore[assignment]
    return needs


def _unfit(node: Obj, pod: Obj, need: Counter[str], used: Counter[str]) -> list[str]:
    """Why `pod` does not fit `node` (the scheduler's filter messages), or [] when it fits."""
    if node["spec"].get("unschedulable"):
        return ["node(s) were unschedulable"]
    if not condition_true(node["status"], "Ready"):
        return ["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"]
    labels = node["metadata"].get("labels") or {}
    selector = pod["spec"].get("nodeSelector") or {}
    terms = (
        ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if any(labels.get(k) != v for k, v in selector.items()) or (
        terms and not any(_term_matches(t, labels) for t in terms)
    ):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = node["status"]["allocatable"]
    reasons = []
    for name, amount in sorted(need.items()):
        if used[name] + amount > parse_quantity(allocatable.get(name, 0)):
            reasons.append("Too many pods" if name == "pods" else f"Insufficient {name}")
    return reasons


def _term_matches(term: Obj, labels: dict[str, str]) -> bool:
    for expr in term.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op in ("Gt", "Lt"):
            if key not in labels or not labels[key].lstrip("-").isdigit():
                return False
            ok = (
                int(labels[key]) > int(values[0])
                if op == "Gt"
                else int(labels[key]) < int(values[0])
            )
        else:
            ok = selector_matches({"matchExpressions": [expr]}, labels)
        if not ok:
            return False
    return True
