"""Per-kind diff rules: which fields update in place and what each kind defaults to."""

from __future__ import annotations

from typing import Any

IN_PLACE_FIELDS: dict[str, frozenset[str]] = {
    "task": frozenset({"priority", "preemptible"}),
    "service": frozenset({"replicas", "scaling", "groups", "priority", "preemptible"}),
    "dev-environment": frozenset({"priority", "inactivity_duration", "preemptible"}),
    "fleet": frozenset(
        {
            "nodes",
            "reservation",
            "tags",
            "resources",
            "backends",
            "regions",
            "availability_zones",
            "instance_types",
            "spot_policy",
            "max_price",
            "idle_duration",
        }
    ),
    "volume": frozenset(),
    "gateway": frozenset({"tags", "default"}),
}

ROLLING_FIELDS: dict[str, frozenset[str]] = {
    "service": frozenset(
        {
            "port",
            "probes",
            "resources",
            "volumes",
            "docker",
            "files",
            "image",
            "user",
            "privileged",
            "entrypoint",
            "working_dir",
            "python",
            "nvcc",
            "single_branch",
            "env",
            "shell",
            "commands",
            "code",  # the fingerprint of the local files and repos it sends (CODE_KEY)
        }
    ),
}
"""Fields whose change updates a kind in place by a rolling deployment (dstack's): each
replica is replaced by one on the new spec, one at a time, the old one stopped once the new
one runs (`runs/rollout.py`). They are what a job runs: `job_spec_hash` hashes them."""

ROLLOUT_KEY = "rollout"
"""The state attribute of a service whose rolling update is not over (`runs/rollout.py`):
the plan updates it again, so that `apply` finishes (or retries) it."""

STATE_ONLY_FIELDS = frozenset({"lifecycle", "depends_on"})
"""Our extensions: changing them rewrites state but touches no machine."""

FINISHED_STATUSES = frozenset({"done", "failed", "terminated", "aborted"})

LONG_RUNNING_KINDS = frozenset({"service", "dev-environment"})
"""Runs meant to run until stopped: one whose jobs failed by themselves has crashed (drift)."""


def is_in_place(kind: str, path: str) -> bool:
    top = path.split(".", 1)[0]
    if top in STATE_ONLY_FIELDS or top in IN_PLACE_FIELDS.get(kind, frozenset()):
        return True
    return is_rolling(kind, path)


def is_rolling(kind: str, path: str) -> bool:
    """Whether a change of `path` is carried out by a rolling deployment of the replicas."""
    return path.split(".", 1)[0] in ROLLING_FIELDS.get(kind, frozenset())


def rolling_paths(kind: str, paths: tuple[str, ...]) -> tuple[str, ...]:
    """The paths of `paths` that roll the replicas (see ROLLING_FIELDS)."""
    return tuple(p for p in paths if is_rolling(kind, p))


def prevents_destroy(kind: str, spec: dict[str, Any] | None) -> bool:
    """`lifecycle.prevent_destroy`, defaulting to true for volumes (deleting data is explicit)."""
    lifecycle = (spec or {}).get("lifecycle") or {}
    explicit = lifecycle.get("prevent_destroy")
    if explicit is not None:
        return bool(explicit)
    return kind == "volume"


def create_before_destroy(spec: dict[str, Any] | None) -> bool:
    return bool(((spec or {}).get("lifecycle") or {}).get("create_before_destroy"))


def ignored_paths(spec: dict[str, Any] | None) -> tuple[str, ...]:
    return tuple(((spec or {}).get("lifecycle") or {}).get("ignore_changes") or ())
