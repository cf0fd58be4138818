"""Admission in the fake Kubernetes API (tests/infra/fake_kube.py): defaults and validation.

A request body is first checked against the client's model (`kube_models.check`: unknown
fields, wrong JSON types, missing required fields), then defaulted as the API server
defaults it (restartPolicy, a Job's selector and labels, a Service's clusterIP...), then
validated by the rules of the API server a backend is most likely to break: names, labels,
container names and images, env names, quantities and extended resources, a Job's
restartPolicy and an Indexed Job's completions, a Deployment's selector against its
template's labels. Problems answer 422 `Invalid` naming the field.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.infra import kube_models
from tests.infra.fake_kube_defaults import DEFAULTS
from tests.infra.fake_kube_objects import selector_matches
from tests.infra.fake_kube_store import (
    Obj,
    Resource,
    bad_request,
    invalid,
    parse_quantity,
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Causes = list[tuple[str, str]]

# -- the whole pipeline


def admit(res: Resource, body: Any, namespace: str, *, creating: bool) -> Obj:
    """`body` checked, defaulted and validated as `res` (raises `KubeError`); a new dict."""
    if not isinstance(body, dict):
        raise bad_request(f"the body of the request is not a {res.kind} object")
    name = str((body.get("metadata") or {}).get("name") or "")
    problems = kube_models.check(body, res.model)
    if problems:
        raise invalid(res, name, [_split_problem(p) for p in problems])
    check_type_meta(res, body, namespace)
    obj = copy.deepcopy(body)
    obj.setdefault("metadata", {})
    DEFAULTS.get(res.kind, lambda o: None)(obj)
    causes = validate_meta(res, obj, creating=creating)
    causes += VALIDATORS.get(res.kind, lambda o: [])(obj)
    if causes:
        raise invalid(res, name, causes)
    return obj


def _split_problem(problem: str) -> tuple[str, str]:
    field, _, why = problem.partition(": ")
    return field, why


def check_type_meta(res: Resource, body: Obj, namespace: str) -> None:
    """400 when the body names another kind, API version or namespace than the URL."""
    if body.get("apiVersion") not in (None, res.api_version) or body.get("kind") not in (
        None,
        res.kind,
    ):
        raise bad_request(
            f"the API version in the data ({body.get('apiVersion')}) does not match the "
            f"expected API version ({res.api_version}), or the kind ({body.get('kind')}) "
            f"is not {res.kind}"
        )
    body_namespace = (body.get("metadata") or {}).get("namespace")
    if res.namespaced and body_namespace not in (None, "", namespace):
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


# -- validation


def validate_meta(res: Resource, obj: Obj, *, creating: bool) -> Causes:
    """Name and labels, as the API server checks every object's metadata."""
    meta = obj["metadata"]
    name = meta.get("name")
    causes: Causes = []
    if not name and not (creating and meta.get("generateName")):
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif name:
        dns1035 = res.kind in ("Service", "Namespace")
        pattern, limit = (_DNS1035_LABEL, 63) if dns1035 else (_DNS_SUBDOMAIN, 253)
        if res.kind == "Namespace":
            pattern = _DNS_LABEL
        if not pattern.match(name) or len(name) > limit:
            what = "a DNS-1035 label" if dns1035 else "a lowercase RFC 1123 subdomain"
            causes.append(("metadata.name", f'Invalid value: "{name}": must be {what}'))
    causes += _labels(meta.get("labels") or {}, "metadata.labels")
    return causes


def _labels(labels: dict[str, str], path: str) -> Causes:
    causes: Causes = []
    for key, value in labels.items():
        prefix, _, label = key.rpartition("/")
        if (
            not _LABEL_NAME.match(label)
            or len(label) > 63
            or (prefix and not _DNS_SUBDOMAIN.match(prefix))
        ):
            causes.append((path, f'Invalid value: "{key}": not a valid label key'))
        if value and (not _LABEL_NAME.match(value) or len(value) > 63):
            causes.append(
                (f"{path}", f'Invalid value: "{value}": a valid label must be 63 characters '
                 "or less, alphanumeric, '-', '_' or '.', starting and ending alphanumeric")
            )  # fmt: skip
    return causes


def validate_pod_spec(spec: Obj, path: str) -> Causes:
    """A pod spec's containers, env and resources; plus the fake's one limit: one container."""
    causes: Causes = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append((f"{path}.containers", "Required value"))
    elif len(containers) > 1 or spec.get("initContainers"):
        causes.append(
            (f"{path}.containers", "Forbidden: fake_kube runs pods of exactly one container")
        )
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        causes.append((f"{path}.restartPolicy", f"Unsupported value: {spec['restartPolicy']!r}"))
    names: set[str] = set()
    for i, container in enumerate(containers):
        at = f"{path}.containers[{i}]"
        name = container.get("name", "")
        if not _DNS_LABEL.match(name) or len(name) > 63:
            causes.append((f"{at}.name", f'Invalid value: "{name}": must be a DNS-1123 label'))
        elif name in names:
            causes.append((f"{at}.name", f'Duplicate value: "{name}"'))
        names.add(name)
        if not container.get("image"):
            causes.append((f"{at}.image", "Required value"))
        for j, env in enumerate(container.get("env") or []):
            if not _ENV_NAME.match(env.get("name", "")):
                causes.append((f"{at}.env[{j}].name", f'Invalid value: "{env.get("name")}"'))
            if env.get("value") is not None and env.get("valueFrom") is not None:
                causes.append(
                    (f"{at}.env[{j}].valueFrom", "Invalid value: may not be specified when "
                     "`value` is not empty")
                )  # fmt: skip
        for j, port in enumerate(container.get("ports") or []):
            if not 0 < port.get("containerPort", 0) < 65536:
                causes.append((f"{at}.ports[{j}].containerPort", "Invalid value: 1-65535"))
            port_name = port.get("name")
            if port_name and (len(port_name) > 15 or not _PORT_NAME.match(port_name)):
                causes.append((f"{at}.ports[{j}].name", f'Invalid value: "{port_name}"'))
        causes += _resources(container.get("resources") or {}, f"{at}.resources")
    return causes


def _resources(resources: Obj, path: str) -> Causes:
    causes: Causes = []
    amounts: dict[str, dict[str, Any]] = {}
    for part in ("limits", "requests"):
        for name, value in (resources.get(part) or {}).items():
            try:
                amounts.setdefault(part, {})[name] = parse_quantity(value)
            except ValueError as e:
                causes.append((f"{path}.{part}[{name}]", f"Invalid value: {value!r}: {e}"))
    limits, requests = amounts.get("limits", {}), amounts.get("requests", {})
    for name, request in requests.items():
        extended = "/" in name and not name.startswith("kubernetes.io/")
        if extended and name not in limits:
            causes.append(
                (f"{path}.limits", "Required value: Limit must be set for non overcommitable "
                 "resources")
            )  # fmt: skip
        elif extended and limits[name] != request:
            causes.append((f"{path}.requests[{name}]", "Invalid value: must be equal to limit"))
        elif name in limits and request > limits[name]:
            causes.append(
                (f"{path}.requests", f"Invalid value: must be less than or equal to {name} limit")
            )
    for name, amount in (limits | requests).items():
        if "/" in name and amount.denominator != 1:
            causes.append((f"{path}.limits[{name}]", "Invalid value: must be an integer"))
    return causes


def _validate_pod(obj: Obj) -> Causes:
    return validate_pod_spec(obj["spec"], "spec")


def _validate_job(obj: Obj) -> Causes:
    spec = obj["spec"]
    causes = validate_pod_spec(spec["template"].get("spec") or {}, "spec.template.spec")
    policy = spec["template"]["spec"].get("restartPolicy")
    if policy not in ("OnFailure", "Never"):
        causes.append(
            ("spec.template.spec.restartPolicy",
             f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"')
        )  # fmt: skip
    for field in ("parallelism", "completions", "backoffLimit", "activeDeadlineSeconds"):
        if (spec.get(field) or 0) < 0:
            causes.append((f"spec.{field}", "Invalid value: must be greater than or equal to 0"))
    if spec["completionMode"] not in ("NonIndexed", "Indexed"):
        causes.append(("spec.completionMode", f'Unsupported value: "{spec["completionMode"]}"'))
    if spec["completionMode"] == "Indexed" and spec.get("completions") is None:
        causes.append(("spec.completions", "Required value: when completion mode is Indexed"))
    generated = {"matchLabels": {"batch.kubernetes.io/controller-uid": obj["metadata"].get("uid")}}
    if spec.get("selector") not in (None, generated) and not spec.get("manualSelector"):
        causes.append(("spec.selector", "Invalid value: `selector` will be auto-generated"))
    return causes


def _validate_deployment(obj: Obj) -> Causes:
    spec = obj["spec"]
    causes = validate_pod_spec(spec["template"].get("spec") or {}, "spec.template.spec")
    if spec["template"]["spec"].get("restartPolicy") != "Always":
        causes.append(
            ("spec.template.spec.restartPolicy", 'Unsupported value: supported values: "Always"')
        )
    labels = (spec["template"].get("metadata") or {}).get("labels") or {}
    if not spec.get("selector"):
        causes.append(("spec.selector", "Required value"))
    elif not selector_matches(spec["selector"], labels) or not labels:
        causes.append(
            ("spec.template.metadata.labels",
             f"Invalid value: {labels!r}: `selector` does not match template `labels`")
        )  # fmt: skip
    if spec["replicas"] < 0:
        causes.append(("spec.replicas", "Invalid value: must be greater than or equal to 0"))
    return causes


def _validate_service(obj: Obj) -> Causes:
    spec, causes = obj["spec"], []
    ports = spec.get("ports") or []
    if not ports and spec.get("clusterIP") != "None" and spec["type"] != "ExternalName":
        causes.append(("spec.ports", "Required value"))
    for i, port in enumerate(ports):
        if not 0 < port["port"] < 65536:
            causes.append((f"spec.ports[{i}].port", "Invalid value: 1-65535"))
        target = port.get("targetPort")
        if isinstance(target, int) and not 0 < target < 65536:
            causes.append((f"spec.ports[{i}].targetPort", "Invalid value: 1-65535"))
        if len(ports) > 1 and not port.get("name"):
            causes.append((f"spec.ports[{i}].name", "Required value"))
    return causes


def _validate_config_data(obj: Obj) -> Causes:
    return [
        (f"data[{key}]", f'Invalid value: "{key}": a valid config key must consist of '
         "alphanumeric characters, '-', '_' or '.'")
        for key in {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}
        if not _CONFIG_KEY.match(key)
    ]  # fmt: skip


def _validate_pvc(obj: Obj) -> Causes:
    spec, causes = obj["spec"], []
    if not spec.get("accessModes"):
        causes.append(("spec.accessModes", "Required value: at least 1 access mode is required"))
    if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
        causes.append(("spec.resources[storage]", "Required value"))
    return causes


VALIDATORS = {
    "Pod": _validate_pod,
    "Job": _validate_job,
    "Deployment": _validate_deployment,
    "Service": _validate_service,
    "Secret": _validate_config_data,
    "ConfigMap": _validate_config_data,
    "PersistentVolumeClaim": _validate_pvc,
}


def check_immutable(res: Resource, old: Obj, new: Obj) -> None:
    """422 when an update changes what the API server forbids changing: a Pod's spec (the
    fake allows none of the few in-place changes), a Job's selector, template and
    completion mode, a Deployment's selector."""
    fields = {
        "Pod": ["spec"],
        "Job": ["selector", "template", "completionMode"],
        "Deployment": ["selector"],
    }.get(res.kind, [])
    for field in fields:
        before = old.get(field) if field == "spec" else old["spec"].get(field)
        after = new.get(field) if field == "spec" else new["spec"].get(field)
        if before != after:
            path = field if field == "spec" else f"spec.{field}"
            raise invalid(
                res, old["metadata"]["name"], [(path, "Invalid value: field is immutable")]
            )
