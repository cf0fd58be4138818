"""The fake Kubernetes API's REST verbs (tests/infra/fake_kube.py): routing a request to a
resource and answering list, get, create, replace, patch, delete and the subresources
(`log`, `status`, `scale`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from tests.infra import fake_kube_admit as admit
from tests.infra import fake_kube_defaults as defaults
from tests.infra import kube_models
from tests.infra.fake_kube_controllers import Controllers
from tests.infra.fake_kube_objects import (
    fields_match,
    json_patch,
    labels_match,
    merge_patch,
    parse_label_selector,
    selector_string,
    strategic_merge_patch,
)
from tests.infra.fake_kube_pods import Kubelet
from tests.infra.fake_kube_store import (
    BY_KIND,
    RESOURCES,
    KubeError,
    Obj,
    Resource,
    Store,
    bad_request,
    conflict,
    invalid,
    not_found,
    success_status,
)
from tests.infra.rest_server import Request

NOT_FOUND = KubeError(404, "NotFound", "the server could not find the requested resource")
NOT_ALLOWED = KubeError(
    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
)
VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-fake",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.24",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass
class Answer:
    """An answer before it is sent: a JSON `body` that must pass `model`, or `raw` bytes."""

    status: int
    body: Any = None
    model: str = ""
    raw: bytes | None = None
    content_type: str = "application/json"


@dataclass
class Route:
    res: Resource
    namespace: str | None
    name: str | None
    sub: str | None


def route(path: str) -> Route:
    """The resource a (decoded) path names; 404 `KubeError` when none."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis" and parts[2] == "v1":
        group, rest = parts[1], parts[3:]
    else:
        raise NOT_FOUND
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    res = RESOURCES.get((group, rest[0])) if rest else None
    if res is None or (namespace is not None and not res.namespaced):
        raise NOT_FOUND
    name = rest[1] if len(rest) > 1 else None
    if res.namespaced and namespace is None and name is not None:
        raise NOT_FOUND  # only lists span every namespace
    return Route(res, namespace, name, "/".join(rest[2:]) or None)


def _arg(request: Request, name: str) -> str | None:
    return request.query.get(name, [None])[0]


def _copy(obj: Obj) -> Obj:
    # answers are serialized after the lock is released: never hand out the stored dict
    return copy.deepcopy(obj)


class Api:
    """Answers the REST calls on the store; called with the fake's lock held."""

    def __init__(self, store: Store, controllers: Controllers, kubelet: Kubelet) -> None:
        self.store, self.controllers, self.kubelet = store, controllers, kubelet

    def serve(self, request: Request, path: str) -> Answer:
        """Answer `request` (its `path` decoded); raises `KubeError`."""
        if path.rstrip("/") == "/version":
            return Answer(200, dict(VERSION), "VersionInfo")
        r = route(path)
        method, res = request.method, r.res
        if isinstance(request.body, str):
            raise bad_request("the body of the request was in an unknown format: not JSON")
        if method != "GET" and not res.writable:
            raise NOT_ALLOWED
        if r.name is None:
            if method == "GET":
                return self._list(request, res, r.namespace)
            if method == "POST" and (r.namespace is not None or not res.namespaced):
                return self._create(request, res, r.namespace or "")
            if method == "DELETE":
                return self._delete_collection(request, res, r.namespace)
            raise NOT_ALLOWED
        namespace = r.namespace or ""
        if r.sub is None:
            handlers = {
                "GET": lambda: Answer(
                    200, _copy(self.store.must_get(res, namespace, r.name)), res.model
                ),
                "PUT": lambda: self._replace(request, res, namespace, r.name),
                "PATCH": lambda: self._patch(request, res, namespace, r.name),
                "DELETE": lambda: self._delete(request, res, namespace, r.name),
            }
            if method not in handlers:
                raise NOT_ALLOWED
            return handlers[method]()
        if r.sub == "status" and method == "GET":
            return Answer(200, _copy(self.store.must_get(res, namespace, r.name)), res.model)
        if r.sub == "log" and res.kind == "Pod" and method == "GET":
            pod = self.store.must_get(res, namespace, r.name)
            return Answer(200, raw=self.kubelet.log(pod, request.query), content_type="text/plain")
        if r.sub == "scale" and res.kind == "Deployment" and method in ("GET", "PATCH", "PUT"):
            return self._scale(request, res, namespace, r.name)
        raise NOT_FOUND

    # -- collections

    def _list(self, request: Request, res: Resource, namespace: str | None) -> Answer:
        if _arg(request, "watch") in ("true", "1"):
            raise bad_request("fake_kube does not serve watches")
        items = self.store.items(res.kind, namespace)
        if labels := _arg(request, "labelSelector"):
            requirements = parse_label_selector(labels)
            items = [
                o for o in items if labels_match(o["metadata"].get("labels") or {}, requirements)
            ]
        if fields := _arg(request, "fieldSelector"):
            items = [o for o in items if fields_match(o, fields)]
        meta: Obj = {"resourceVersion": self.store.latest}
        start = int(_arg(request, "continue") or 0)
        limit = int(_arg(request, "limit") or 0)
        if limit and start + limit < len(items):
            meta["continue"] = str(start + limit)
            meta["remainingItemCount"] = len(items) - start - limit
        items = items[start : start + limit] if limit else items[start:]
        # the API server leaves kind and apiVersion out of a list's items
        bare = [
            {k: v for k, v in _copy(o).items() if k not in ("kind", "apiVersion")} for o in items
        ]
        body = {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": bare,
        }
        return Answer(200, body, f"{res.model}List")

    def _create(self, request: Request, res: Resource, namespace: str) -> Answer:
        if request.query.get("dryRun"):
            raise bad_request("fake_kube does not support dryRun")
        if res.namespaced and self.store.get("Namespace", "", namespace) is None:
            raise not_found(BY_KIND["Namespace"], namespace)
        obj = admit.admit(res, request.body, namespace, creating=True)
        if res.kind == "Pod":
            obj["status"] = {"phase": "Pending", "qosClass": defaults.qos_class(obj["spec"])}
        elif res.kind in ("Job", "Deployment"):
            obj["status"] = {}
        obj = self.store.create(res, obj, namespace)
        uid = obj["metadata"]["uid"]
        if res.kind == "Job":
            defaults.label_job(obj)
        elif res.kind == "PersistentVolumeClaim":
            spec = obj["spec"]
            spec["volumeName"] = f"pvc-{uid}"
            obj["status"] = {
                "phase": "Bound",
                "accessModes": list(spec["accessModes"]),
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            }
        self.store.put(obj)
        self.controllers.settle()
        return Answer(201, _copy(obj), res.model)

    def _delete_collection(self, request: Request, res: Resource, namespace: str | None) -> Answer:
        listed = self._list(request, res, namespace).body["items"]
        grace, propagation = self._delete_options(request)
        for item in listed:
            obj = self.store.get(res.kind, namespace or "", item["metadata"]["name"])
            if obj is not None:
                self.controllers.delete(res, obj, grace, propagation)
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        return Answer(200, body, "V1Status")

    # -- objects

    def _replace(self, request: Request, res: Resource, namespace: str, name: str) -> Answer:
        current = self.store.must_get(res, namespace, name)
        body_name = ((request.body or {}).get("metadata") or {}).get("name")
        if body_name != name:
            raise bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        new = admit.admit(res, request.body, namespace, creating=False)
        return self._update(res, current, new)

    def _patch(self, request: Request, res: Resource, namespace: str, name: str) -> Answer:
        current = self.store.must_get(res, namespace, name)
        patched = self._apply_patch(request, current)
        new = admit.admit(res, patched, namespace, creating=False)
        return self._update(res, current, new)

    def _apply_patch(self, request: Request, current: Obj) -> Obj:
        content_type = (
            next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
            .split(";")[0]
            .strip()
        )
        body = request.body
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise bad_request("a JSON patch must be an array of operations")
            return json_patch(current, body)
        if content_type not in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            raise KubeError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: application/json-patch+json, application/merge-patch+json, "
                f'application/strategic-merge-patch+json (fake_kube: not "{content_type}")',
            )
        if not isinstance(body, dict):
            raise bad_request(f"a {content_type} patch must be an object")
        if content_type == "application/merge-patch+json":
            return merge_patch(current, body)
        return strategic_merge_patch(current, body)

    def _update(self, res: Resource, current: Obj, new: Obj) -> Answer:
        meta, old_meta = new["metadata"], current["metadata"]
        name = old_meta["name"]
        if meta.get("resourceVersion") not in (None, old_meta["resourceVersion"]):
            raise conflict(
                res,
                name,
                "the object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        admit.check_immutable(res, current, new)
        for kept in ("name", "namespace", "uid", "creationTimestamp", "generation",
                     "deletionTimestamp", "deletionGracePeriodSeconds"):  # fmt: skip
            if kept in old_meta:
                meta[kept] = old_meta[kept]
            else:
                meta.pop(kept, None)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        # the main resource does not write status (the status subresource does)
        if "status" in current:
            new["status"] = current["status"]
        if "generation" in meta and new.get("spec") != current.get("spec"):
            meta["generation"] += 1
        self.store.put(new)
        self.controllers.settle()
        return Answer(
            200, _copy(self.store.get(res.kind, meta.get("namespace", ""), name) or new), res.model
        )

    def _delete_options(self, request: Request) -> tuple[int | None, str | None]:
        options = request.body if isinstance(request.body, dict) else {}
        problems = kube_models.check(options, "V1DeleteOptions")
        if problems:
            raise KubeError(422, "Invalid", "DeleteOptions is invalid: " + "; ".join(problems))
        grace = options.get("gracePeriodSeconds")
        if grace is None and _arg(request, "gracePeriodSeconds") is not None:
            grace = int(_arg(request, "gracePeriodSeconds") or 0)
        propagation = options.get("propagationPolicy") or _arg(request, "propagationPolicy")
        orphan = options.get("orphanDependents", _arg(request, "orphanDependents"))
        if propagation is None and orphan in (True, "true"):
            propagation = "Orphan"
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise KubeError(
                422, "Invalid", f'propagationPolicy: Unsupported value: "{propagation}"'
            )
        return grace, propagation

    def _delete(self, request: Request, res: Resource, namespace: str, name: str) -> Answer:
        obj = self.store.must_get(res, namespace, name)
        grace, propagation = self._delete_options(request)
        preconditions = (request.body or {}).get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) not in (None, obj["metadata"][key]):
                why = (
                    f"Precondition failed: {key} in precondition: {preconditions[key]}, "
                    f"{key} in object meta: {obj['metadata'][key]}"
                )
                raise conflict(res, name, why)
        last = _copy(obj)
        self.controllers.delete(res, obj, grace, propagation)
        still = self.store.get(res.kind, namespace, name)
        if still is not None and still["metadata"]["uid"] == last["metadata"]["uid"]:
            return Answer(202 if propagation == "Foreground" else 200, _copy(still), res.model)
        if res.delete_returns_status:
            return Answer(200, success_status(res, last), "V1Status")
        return Answer(200, last, res.model)

    def _scale(self, request: Request, res: Resource, namespace: str, name: str) -> Answer:
        deploy = self.store.must_get(res, namespace, name)
        scale = _scale_of(deploy)
        if request.method != "GET":
            body = self._apply_patch(request, scale) if request.method == "PATCH" else request.body
            problems = kube_models.check(body, "V1Scale")
            replicas = ((body or {}).get("spec") or {}).get("replicas", 0)
            if problems or not isinstance(replicas, int) or replicas < 0:
                causes = [(p.partition(": ")[0], p.partition(": ")[2]) for p in problems]
                raise invalid(
                    res, name, causes or [("spec.replicas", "Invalid value: must be >= 0")]
                )
            if replicas != deploy["spec"]["replicas"]:
                deploy["spec"]["replicas"] = replicas
                deploy["metadata"]["generation"] += 1
                self.store.put(deploy)
                self.controllers.settle()
            scale = _scale_of(self.store.must_get(res, namespace, name))
        return Answer(200, scale, "V1Scale")


def _scale_of(deploy: Obj) -> Obj:
    meta = deploy["metadata"]
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        },
        "spec": {"replicas": deploy["spec"]["replicas"]},
        "status": {
            "replicas": (deploy.get("status") or {}).get("replicas", 0),
            "selector": selector_string(deploy["spec"]["selector"]),
        },
    }
