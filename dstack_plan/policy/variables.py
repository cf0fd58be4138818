"""The values a rule is evaluated on, computed from the JSON plan (types in `schema.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dstack_plan.config.kinds import RUN_KINDS

Values = dict[str, Any]

_ACTIONS = {
    ("create",): "create",
    ("update",): "update",
    ("delete", "create"): "replace",
    ("create", "delete"): "replace",
    ("delete",): "delete",
    ("no-op",): "no-op",
}
_DEFAULT_REGISTRY = "docker.io"


def action_of(actions: list[str]) -> str:
    """`create`, `update`, `replace`, `delete` or `no-op` from Terraform's `actions` list."""
    return _ACTIONS.get(tuple(actions), "-".join(actions))


def registry_of(image: str) -> str:
    """The registry an image reference pulls from, as Docker resolves it: the first path
    component when it looks like a host (has a `.` or `:`, or is `localhost`), else Docker
    Hub (`ubuntu:22.04`, `library/ubuntu`, `index.docker.io/x` are all `docker.io`)."""
    if not image:
        return ""
    first, slash, _ = image.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        return _DEFAULT_REGISTRY
    host = first.lower()
    return _DEFAULT_REGISTRY if host in ("index.docker.io", "registry-1.docker.io") else host


def plan_values(document: dict[str, Any]) -> Values:
    """The variables of a rule from `document`, a plan as `plan_to_json` writes it."""
    changes = [_change(c) for c in document["resource_changes"]]
    pairs = zip(changes, document["resource_changes"], strict=True)
    runs = [_run(c, raw) for c, raw in pairs if _is_run(c)]
    cost = document["cost"]
    before, after = float(cost["before"]), float(cost["after"])
    by_namespace: dict[str, float] = {}
    for run in runs:
        by_namespace[run["namespace"]] = by_namespace.get(run["namespace"], 0.0) + run["gpus"]
    return {
        "plan": document,
        "changes": changes,
        "runs": runs,
        "cost": {"before": before, "after": after, "delta": after - before},
        "gpus": {"total": sum(r["gpus"] for r in runs), "by_namespace": by_namespace},
        "summary": dict(document["summary"]),
        "deletions": [_address(c) for c in changes if c["action"] == "delete"],
        "replacements": [_address(c) for c in changes if c["action"] == "replace"],
    }


def plan_functions(values: Values) -> dict[str, Callable[[str], list[str]]]:
    """`created(kind)`, `updated(kind)`, `replaced(kind)`, `deleted(kind)`: the addresses of
    the changes of that kind with that action (`"*"`: any kind)."""

    def of(action: str) -> Callable[[str], list[str]]:
        def addresses(kind: str) -> list[str]:
            return [
                c["address"]
                for c in values["changes"]
                if c["action"] == action and (kind == "*" or c["kind"] == kind)
            ]

        return addresses

    return {
        "created": of("create"),
        "updated": of("update"),
        "replaced": of("replace"),
        "deleted": of("delete"),
    }


def _change(raw: dict[str, Any]) -> dict[str, Any]:
    change = raw["change"]
    return {
        "address": raw["address"],
        "kind": raw["type"],
        "name": raw["name"],
        "provider": raw["provider_name"],
        "action": action_of(change["actions"]),
        "reason": raw["reason"],
        "before": change["before"],
        "after": change["after"],
        "changed_paths": [".".join(p) for p in change["changed_paths"]],
        "replace_paths": [".".join(p) for p in change["replace_paths"]],
    }


def _address(change: dict[str, Any]) -> dict[str, Any]:
    return {"address": change["address"], "kind": change["kind"], "name": change["name"]}


def _is_run(change: dict[str, Any]) -> bool:
    return change["kind"] in RUN_KINDS and change["after"] is not None


def _run(change: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    spec = change["after"]
    per_job = _job_gpus(change["kind"], spec)
    image = str(spec.get("image") or "")
    placement = raw.get("placement") or {}
    return {
        "address": change["address"],
        "kind": change["kind"],
        "name": change["name"],
        "action": change["action"],
        "gpus": float(sum(per_job)),
        "gpus_per_job": float(max(per_job, default=0.0)),
        "jobs": len(per_job),
        "image": image,
        "registry": registry_of(image),
        "labels": {str(k): str(v) for k, v in (spec.get("labels") or {}).items()},
        "namespace": str(spec.get("namespace") or "default"),
        "fleet": str(placement.get("fleet") or ""),
        "price_per_hour": float(placement.get("price_per_hour") or 0.0),
    }


def _job_gpus(kind: str, spec: dict[str, Any]) -> list[float]:
    """The GPUs each job of the run asks for: the lower bound of its count (a shared GPU as
    its fraction), per node of a task and per replica of a service, as quotas count them."""
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.plan.normalize import spec_from_normalized
    from dstack_plan.runs.usage import slot_gpus

    parsed = spec_from_normalized(kind, spec)
    assert isinstance(parsed, RunSpec)
    return list(slot_gpus(parsed).values())
