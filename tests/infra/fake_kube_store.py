"""The fake Kubernetes API's store (tests/infra/fake_kube.py): the resources it serves,
`Status` errors as the API server words them, the objects with their server-set metadata
(uid, resourceVersion, creationTimestamp, generated names), and resource quantities.
"""

from __future__ import annotations

import datetime
import itertools
import random
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

Obj = dict[str, Any]

# k8s.io/apimachinery/pkg/util/rand: consonants and digits, so no generated name spells a word
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def random_suffix(length: int = 5) -> str:
    """A random name suffix as the API server and controllers make them."""
    return "".join(random.choice(SAFE_ALPHABET) for _ in range(length))


def now_rfc3339() -> str:
    """Now as metadata times are written (RFC 3339, seconds, UTC `Z`)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(seconds: float) -> str:
    """A Unix time as log timestamps are written (RFC 3339 with nanoseconds, `Z`)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


@dataclass(frozen=True)
class Resource:
    """One REST resource: where it is served and which client model describes it."""

    plural: str
    kind: str
    group: str  # "" for the core group
    version: str
    namespaced: bool
    writable: bool = True
    """False: only get and list (nodes, and replica sets made by the fake's controller)."""
    delete_returns_status: bool = False
    """Whether a finished delete answers a `Status` (the client's type is `object`) rather
    than the object."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def model(self) -> str:
        """The client's model name, e.g. `V1Job`."""
        return f"V1{self.kind}"

    @property
    def qualified(self) -> str:
        """`jobs.batch` as messages name a resource (`pods` in the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """`Job.batch` as validation messages name a kind (`Pod` in the core group)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


RESOURCES: dict[tuple[str, str], Resource] = {
    (r.group, r.plural): r
    for r in [
        Resource("namespaces", "Namespace", "", "v1", False),
        Resource("nodes", "Node", "", "v1", False, writable=False),
        Resource("pods", "Pod", "", "v1", True),
        Resource("secrets", "Secret", "", "v1", True, delete_returns_status=True),
        Resource("configmaps", "ConfigMap", "", "v1", True, delete_returns_status=True),
        Resource("services", "Service", "", "v1", True),
        Resource("persistentvolumeclaims", "PersistentVolumeClaim", "", "v1", True),
        Resource("jobs", "Job", "batch", "v1", True, delete_returns_status=True),
        Resource("deployments", "Deployment", "apps", "v1", True, delete_returns_status=True),
        Resource(
            "replicasets", "ReplicaSet", "apps", "v1", True, False, delete_returns_status=True
        ),
    ]
}
BY_KIND: dict[str, Resource] = {r.kind: r for r in RESOURCES.values()}


class KubeError(Exception):
    """A request refused with a Kubernetes `Status` (what the client raises ApiException
    with)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        """The `Status` body."""
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(res: Resource, name: str) -> Obj:
    details: Obj = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return details


def not_found(res: Resource, name: str) -> KubeError:
    """404 as the API server words it: `jobs.batch "x" not found`."""
    return KubeError(404, "NotFound", f'{res.qualified} "{name}" not found', _details(res, name))


def already_exists(res: Resource, name: str) -> KubeError:
    """409 `AlreadyExists`."""
    message = f'{res.qualified} "{name}" already exists'
    return KubeError(409, "AlreadyExists", message, _details(res, name))


def conflict(res: Resource, name: str, why: str) -> KubeError:
    """409 `Conflict` (a stale resourceVersion, a failed precondition)."""
    message = f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}'
    return KubeError(409, "Conflict", message, _details(res, name))


def bad_request(message: str) -> KubeError:
    """400 `BadRequest`."""
    return KubeError(400, "BadRequest", message)


def invalid(res: Resource, name: str, causes: list[tuple[str, str]]) -> KubeError:
    """422 `Invalid`, one cause per (field path, what is wrong)."""
    texts = [f"{field}: {why}" if field else why for field, why in causes]
    listed = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = _details(res, name) | {"kind": res.kind}
    details["causes"] = [
        {"reason": "FieldValueInvalid", "message": why, "field": field} for field, why in causes
    ]
    return KubeError(
        422, "Invalid", f'{res.qualified_kind} "{name}" is invalid: {listed}', details
    )


def success_status(res: Resource, obj: Obj) -> Obj:
    """The `Status` a finished delete answers for kinds whose client type is `object`."""
    details = _details(res, obj["metadata"]["name"]) | {"uid": obj["metadata"]["uid"]}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


class Store:
    """Every object, by (kind, namespace, name); namespace "" for cluster-scoped kinds.
    Callers hold the fake's lock."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self._versions = itertools.count(1)
        self.latest = "0"
        """The last resourceVersion handed out (a list's)."""

    def resource_version(self) -> str:
        """A fresh resourceVersion (one counter for every kind, as etcd's revision)."""
        self.latest = str(next(self._versions))
        return self.latest

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return self.objects.get((kind, namespace, name))

    def must_get(self, res: Resource, namespace: str, name: str) -> Obj:
        """The object, or a 404 `KubeError`."""
        obj = self.get(res.kind, namespace, name)
        if obj is None:
            raise not_found(res, name)
        return obj

    def items(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """The objects of `kind` (in `namespace` unless None), oldest first."""
        return [
            o
            for (k, ns, _), o in self.objects.items()
            if k == kind and (namespace is None or ns == namespace)
        ]

    def by_uid(self, uid: str) -> Obj | None:
        return next((o for o in self.objects.values() if o["metadata"]["uid"] == uid), None)

    def dependents(self, uid: str) -> list[Obj]:
        """Objects with an owner reference to `uid`."""
        return [
            o
            for o in self.objects.values()
            if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences", []))
        ]

    def create(self, res: Resource, obj: Obj, namespace: str) -> Obj:
        """Stamp server-set metadata on `obj` (name from generateName, uid, resourceVersion,
        creationTimestamp, namespace, generation) and store it; 409 when the name is taken."""
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + random_suffix()
        name = meta["name"]
        if self.get(res.kind, namespace, name) is not None:
            raise already_exists(res, name)
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        for server_set in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(server_set, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if res.namespaced:
            meta["namespace"] = namespace
        if "spec" in obj and res.kind in ("Job", "Deployment", "ReplicaSet"):
            meta["generation"] = 1
        self.put(obj)
        return obj

    def put(self, obj: Obj) -> None:
        """Store `obj` (new or changed) under a fresh resourceVersion."""
        meta = obj["metadata"]
        meta["resourceVersion"] = self.resource_version()
        self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj

    def remove(self, obj: Obj) -> None:
        meta = obj["metadata"]
        self.objects.pop((obj["kind"], meta.get("namespace", ""), meta["name"]), None)


# -- quantities

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
_SUFFIXES: dict[str, int | Fraction] = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "k": 10**3,
    "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def parse_quantity(value: Any) -> Fraction:
    """A resource quantity (`500m`, `2`, `8Gi`, `1e3`, or a number) as an exact number;
    ValueError when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Fraction(value)
    m = _QUANTITY.match(str(value).strip())
    if m is None:
        raise ValueError(f"quantities must match the regular expression: {value!r}")
    number = Fraction(m.group(1))
    if m.group(2):
        exponent = int(m.group(2))
        return number * (Fraction(10**exponent) if exponent >= 0 else Fraction(1, 10**-exponent))
    return number * _SUFFIXES.get(m.group(3) or "", 1)


def container_requests(containers: Iterable[Obj]) -> dict[str, Fraction]:
    """What the containers ask the scheduler for: each resource's request, or its limit when
    the request is absent (the API server defaults requests to limits), summed."""
    total: dict[str, Fraction] = {}
    for container in containers:
        resources = container.get("resources") or {}
        asked = dict(resources.get("limits") or {}) | dict(resources.get("requests") or {})
        for name, value in asked.items():
            total[name] = total.get(name, Fraction(0)) + parse_quantity(value)
    return total
