"""A fake pod's container environment and argv (tests/infra/fake_kube_pods.py).

PATH, HOME and LANG of the test process, then the container's `envFrom` (every key of a
Secret or ConfigMap, with its prefix), then its `env` in order (plain values with `$(VAR)`
expanded, secretKeyRef, configMapKeyRef, fieldRef), then HOSTNAME (`spec.hostname`, else
the pod's name). argv is `command` + `args`, `$(VAR)` expanded from the container's own
variables, as the kubelet does.
"""

from __future__ import annotations

import base64
import os
import re
from typing import Any

from tests.infra.fake_kube_store import Obj, Store

POD_IP = "127.0.0.1"
"""Every pod's (and node's) address: the pods are processes of this machine."""


class ConfigError(Exception):
    """The container cannot be made (`CreateContainerConfigError`): a missing secret or
    key; retried on every sync, as the kubelet retries."""


def expand(text: str, values: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`,
    anything else is left as written."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return values.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)", one, text)


def environment(store: Store, pod: Obj, container: Obj) -> tuple[dict[str, str], list[str]]:
    """The environment and argv of the pod's container; ConfigError when a secret, config
    map or key it needs is missing, or it has no command."""
    meta = pod["metadata"]
    namespace = meta["namespace"]
    defined: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for ref_key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
            ref = source.get(ref_key)
            if ref is not None:
                data = _config(store, kind, namespace, ref["name"], ref.get("optional"))
                defined.update({prefix + k: v for k, v in (data or {}).items()})
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        if source is None:
            defined[var["name"]] = expand(var.get("value") or "", defined)
            continue
        value = _value_from(store, pod, source)
        if value is not None:
            defined[var["name"]] = value
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env.update(defined)
    env["HOSTNAME"] = pod["spec"].get("hostname") or meta["name"]
    argv = [expand(a, defined) for a in (container.get("command") or [])]
    if not argv:
        raise ConfigError(
            "fake_kube runs a container's command: without one, the image's entrypoint "
            "would run, which the fake does not know"
        )
    argv += [expand(a, defined) for a in (container.get("args") or [])]
    return env, argv


def _config(
    store: Store, kind: str, namespace: str, name: str, optional: Any
) -> dict[str, str] | None:
    obj = store.get(kind, namespace, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind.lower()} "{name}" not found')
    if kind == "ConfigMap":
        return dict(obj.get("data") or {})
    return {
        k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()
    }


def _value_from(store: Store, pod: Obj, source: Obj) -> str | None:
    for ref_key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
        ref = source.get(ref_key)
        if ref is None:
            continue
        data = _config(store, kind, pod["metadata"]["namespace"], ref["name"], ref.get("optional"))
        if data is None:
            return None
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            where = f"{pod['metadata']['namespace']}/{ref['name']}"
            raise ConfigError(f"couldn't find key {ref['key']} in {kind} {where}")
        return data[ref["key"]]
    if "fieldRef" in source:
        return _field_ref(pod, source["fieldRef"]["fieldPath"])
    raise ConfigError(f"fake_kube does not resolve env valueFrom {sorted(source)}")


def _field_ref(pod: Obj, path: str) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": POD_IP,
        "status.hostIP": POD_IP,
        "status.podIPs": POD_IP,
        "status.hostIPs": POD_IP,
    }
    if path not in values:
        raise ConfigError(f"unsupported fieldRef fieldPath {path!r}")
    return values[path]
