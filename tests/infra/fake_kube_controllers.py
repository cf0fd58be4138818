"""The fake Kubernetes cluster's control plane (tests/infra/fake_kube.py): scheduler, Job,
ReplicaSet and Deployment controllers, garbage collector, graceful deletion.

The controllers are level-triggered, as the real ones: `settle` runs every one of them over
every object until a pass changes nothing. It runs under the fake's lock at the end of each
request that changed something and after each process exit (the kubelet's waiter threads),
so nothing waits for a resync period and nothing polls.
"""

from __future__ import annotations

import copy
import datetime
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from tests.infra import fake_kube_defaults as defaults
from tests.infra.fake_kube_jobs import JobController
from tests.infra.fake_kube_objects import live, owned_by, owner_ref, pod_ready, set_condition
from tests.infra.fake_kube_pods import Kubelet
from tests.infra.fake_kube_scheduler import schedule
from tests.infra.fake_kube_store import BY_KIND, Obj, Resource, Store, now_rfc3339


class Controllers:
    """The control plane over `store`; every method is called with `lock` held."""

    def __init__(self, store: Store, kubelet: Kubelet, lock: threading.RLock) -> None:
        self.store, self.kubelet, self.lock = store, kubelet, lock
        self.jobs = JobController(self)
        self._timers: dict[tuple[str, str], threading.Timer] = {}
        self.stopping = False

    def settle(self) -> None:
        """Run every controller until none changes anything."""
        if self.stopping:
            return
        for _ in range(200):
            changed = self._reap()
            changed |= self._collect_garbage()
            for kind, sync in (
                ("Deployment", self._sync_deployment),
                ("ReplicaSet", self._sync_replicaset),
                ("Job", self.jobs.sync),
            ):
                for obj in self.store.items(kind):
                    changed |= sync(obj)
            changed |= schedule(self.store)
            changed |= self.kubelet.sync()
            if not changed:
                return
        raise RuntimeError("fake_kube: the controllers did not settle in 200 passes")

    def stop(self) -> None:
        self.stopping = True
        for timer in self._timers.values():
            timer.cancel()

    # -- deletion

    def delete(self, res: Resource, obj: Obj, grace: int | None, propagation: str | None) -> None:
        """Delete as the API server does: a pod gracefully (SIGTERM, then SIGKILL after
        `grace`, else its terminationGracePeriodSeconds); dependents per `propagation`
        (default: Orphan for Jobs, as batch/v1 keeps it, Background for the rest)."""
        meta = obj["metadata"]
        propagation = propagation or ("Orphan" if res.kind == "Job" else "Background")
        dependents = self.store.dependents(meta["uid"])
        if propagation == "Orphan":
            for dep in dependents:
                refs = [
                    r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != meta["uid"]
                ]
                dep["metadata"]["ownerReferences"] = refs
                if not refs:
                    del dep["metadata"]["ownerReferences"]
                self.store.put(dep)
        if res.kind == "Pod":
            self.delete_pod(obj, grace)
        elif propagation == "Foreground" and dependents:
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now_rfc3339()
                meta["deletionGracePeriodSeconds"] = 0
                meta.setdefault("finalizers", []).append("foregroundDeletion")
                self.store.put(obj)
            for dep in dependents:
                self.delete(BY_KIND[dep["kind"]], dep, None, "Background")
        else:
            self.store.remove(obj)  # the garbage collector takes the dependents
        self.settle()

    def delete_pod(self, pod: Obj, grace: int | None) -> None:
        """Delete a pod gracefully (`grace` None: its terminationGracePeriodSeconds); at once
        when its process does not run."""
        meta = pod["metadata"]
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        if grace == 0 or not self.kubelet.active(meta["uid"]):
            self.kubelet.terminate(pod, 0)
            self.store.remove(pod)
            self.kubelet.forget(meta["uid"])
            return
        if not meta.get("deletionTimestamp"):
            until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
                seconds=grace
            )
            meta["deletionTimestamp"] = until.strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["deletionGracePeriodSeconds"] = grace
            self.store.put(pod)
        self.kubelet.terminate(pod, grace)

    def _reap(self) -> bool:
        """Remove terminating pods whose process ended, and foreground-deleted owners whose
        dependents are gone."""
        changed = False
        for obj in list(self.store.objects.values()):
            meta = obj["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            if obj["kind"] == "Pod" and not self.kubelet.active(meta["uid"]):
                self.store.remove(obj)
                self.kubelet.forget(meta["uid"])
                changed = True
            elif "foregroundDeletion" in (meta.get("finalizers") or []):
                if not self.store.dependents(meta["uid"]):
                    self.store.remove(obj)
                    changed = True
        return changed

    def _collect_garbage(self) -> bool:
        """Delete (in the background) objects all of whose owners are gone."""
        uids = {o["metadata"]["uid"] for o in self.store.objects.values()}
        changed = False
        for obj in list(self.store.objects.values()):
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and not obj["metadata"].get("deletionTimestamp"):
                if not any(r.get("uid") in uids for r in refs):
                    if obj["kind"] == "Pod":
                        self.delete_pod(obj, None)
                    else:
                        self.store.remove(obj)
                    changed = True
        return changed

    def after(self, key: tuple[str, str], seconds: float, action: Callable[[], Any]) -> None:
        """Run `action` under the lock after `seconds`, then settle."""

        def fire() -> None:
            with self.lock:
                if not self.stopping:
                    action()
                    self.settle()

        if key in self._timers:
            self._timers[key].cancel()
        timer = self._timers[key] = threading.Timer(seconds, fire)
        timer.daemon = True
        timer.start()

    def delete_by_uid(self, uid: str) -> None:
        """Delete (in the background) the object of `uid`, if it still exists."""
        obj = self.store.by_uid(uid)
        if obj is not None:
            self.delete(BY_KIND[obj["kind"]], obj, None, "Background")

    # -- ReplicaSets and Deployments

    def _sync_replicaset(self, rs: Obj) -> bool:
        meta = rs["metadata"]
        if meta.get("deletionTimestamp"):
            return False
        pods = [p for p in self.store.items("Pod", meta["namespace"]) if owned_by(p, meta["uid"])]
        alive = [p for p in pods if live(p)]
        want = rs["spec"]["replicas"]
        template = rs["spec"]["template"]
        for _ in range(want - len(alive)):
            spec = copy.deepcopy(template["spec"])
            alive.append(self.new_pod(rs, template, spec, f"{meta['name']}-", {}, {}))
        if len(alive) > want:
            # the ReplicaSet controller removes unscheduled, then not ready, then newest first
            ranked = sorted(
                enumerate(alive),
                key=lambda p: (bool(p[1]["spec"].get("nodeName")), pod_ready(p[1]), -p[0]),
            )
            for _, pod in ranked[: len(alive) - want]:
                self.delete_pod(pod, None)
            alive = [p for p in alive if live(p)]
        ready = sum(1 for p in alive if pod_ready(p))
        status = {
            "replicas": len(alive),
            "fullyLabeledReplicas": len(alive),
            "readyReplicas": ready,
        }
        status |= {"availableReplicas": ready, "observedGeneration": meta.get("generation", 1)}
        status = {k: v for k, v in status.items() if v}
        status["replicas"] = len(alive)  # not omitempty
        if rs.get("status") == status:
            return False
        rs["status"] = status
        self.store.put(rs)
        return True

    def _sync_deployment(self, deploy: Obj) -> bool:
        meta, spec = deploy["metadata"], deploy["spec"]
        if meta.get("deletionTimestamp"):
            return False
        namespace, changed = meta["namespace"], False
        pod_hash = defaults.template_hash(spec["template"])
        replica_sets = [
            rs for rs in self.store.items("ReplicaSet", namespace) if owned_by(rs, meta["uid"])
        ]
        current = next(
            (rs for rs in replica_sets if rs["metadata"]["name"] == f"{meta['name']}-{pod_hash}"),
            None,
        )
        if current is None:
            current = self._new_replicaset(deploy, pod_hash, len(replica_sets) + 1)
            replica_sets.append(current)
            changed = True
        for rs in replica_sets:
            want = spec["replicas"] if rs is current else 0
            if rs["spec"]["replicas"] != want:
                rs["spec"]["replicas"] = want
                self.store.put(rs)
                changed = True
        pods = [
            p
            for p in self.store.items("Pod", namespace)
            if live(p) and any(owned_by(p, rs["metadata"]["uid"]) for rs in replica_sets)
        ]
        updated = [p for p in pods if owned_by(p, current["metadata"]["uid"])]
        ready = sum(1 for p in pods if pod_ready(p))
        before = copy.deepcopy(deploy.get("status") or {})
        counts = {
            "replicas": len(pods),
            "updatedReplicas": len(updated),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(spec["replicas"] - ready, 0),
        }
        # a new dict: the stored status must not change unless it is stored again
        status = {**before, **counts}
        status = {k: v for k, v in status.items() if v != 0}  # omitempty
        status["observedGeneration"] = meta.get("generation", 1)
        conditions = status.setdefault("conditions", [])
        available = ready >= spec["replicas"] - _max_unavailable(spec)
        set_condition(
            conditions,
            "Available",
            "True" if available else "False",
            "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "Deployment has minimum availability."
            if available
            else "Deployment does not have minimum availability.",
        )
        complete = len(updated) == len(pods) == spec["replicas"] == ready
        set_condition(
            conditions,
            "Progressing",
            "True",
            "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
            f'ReplicaSet "{current["metadata"]["name"]}" '
            + ("has successfully progressed." if complete else "is progressing."),
        )
        if status != before:
            deploy["status"] = status
            self.store.put(deploy)
            changed = True
        return changed

    def _new_replicaset(self, deploy: Obj, pod_hash: str, revision: int) -> Obj:
        spec = deploy["spec"]
        template = copy.deepcopy(spec["template"])
        template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = (
            pod_hash
        )
        selector = copy.deepcopy(spec["selector"])
        selector.setdefault("matchLabels", {})["pod-template-hash"] = pod_hash
        rs = {
            "metadata": {
                "name": f"{deploy['metadata']['name']}-{pod_hash}",
                "labels": dict(template["metadata"]["labels"]),
                "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                "ownerReferences": [owner_ref(deploy)],
            },
            "spec": {"replicas": spec["replicas"], "selector": selector, "template": template},
            "status": {"replicas": 0},
        }
        return self.store.create(BY_KIND["ReplicaSet"], rs, deploy["metadata"]["namespace"])

    # -- pods from templates

    def new_pod(
        self,
        owner: Obj,
        template: Obj,
        spec: Obj,
        generate_name: str,
        labels: dict[str, str],
        annotations: dict[str, str],
    ) -> Obj:
        template_meta = template.get("metadata") or {}
        meta: Obj = {
            "generateName": generate_name,
            "labels": {**(template_meta.get("labels") or {}), **labels},
            "ownerReferences": [owner_ref(owner)],
        }
        if template_meta.get("annotations") or annotations:
            meta["annotations"] = {**(template_meta.get("annotations") or {}), **annotations}
        pod = {
            "metadata": meta,
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": defaults.qos_class(spec)},
        }
        defaults.DEFAULTS["Pod"](pod)
        return self.store.create(BY_KIND["Pod"], pod, owner["metadata"]["namespace"])


def _max_unavailable(spec: Obj) -> int:
    value = ((spec.get("strategy") or {}).get("rollingUpdate") or {}).get("maxUnavailable", "25%")
    if isinstance(value, str) and value.endswith("%"):
        return int(Fraction(int(value[:-1]), 100) * spec["replicas"])  # rounded down
    return int(value)
