"""Per-kind diff rules: which fields update in place and what each kind defaults to."""

from __future__ import annotations

from typing import Any

IN_PLACE_FIELDS: dict[str, frozenset[str]] = {
    "task": frozenset({"priority"}),
    "service": frozenset({"replicas", "scaling", "groups", "priority"}),
    "dev-environment": frozenset({"priority", "inactivity_duration"}),
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

STATE_ONLY_FIELDS = frozenset({"lifecycle", "depends_on"})
"""Our extensions: changing them rewrites state but touches no machine."""

FINISHED_STATUSES = frozenset({"done", "failed", "terminated", "aborted"})

LONG_RUNNING_KINDS = frozenset({"service", "dev-environment"})
"""Runs meant to run until stopped: one whose jobs failed by themselves has crashed (drift)."""


def is_in_place(kind: str, path: str) -> bool:
    top = path.split(".", 1)[0]
    return top in STATE_ONLY_FIELDS or top in IN_PLACE_FIELDS.get(kind, frozenset())


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
