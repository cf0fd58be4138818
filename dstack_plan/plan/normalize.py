"""Normalised specs: defaults filled, units canonical, so equal configs compare equal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dstack_plan.config.base import STORED
from dstack_plan.config.kinds import spec_class

if TYPE_CHECKING:
    from dstack_plan.config.kinds import AnySpec


CODE_KEY = "code"
"""A run's normalised spec also holds the fingerprint of the local files it sends (see
`runs/code_archive.py`), so that changed content is a change of the run; no model field."""


def spec_from_normalized(kind: str, data: dict[str, Any]) -> AnySpec:
    """Rebuild the typed spec from its normalised JSON (a saved plan or state entry)."""
    if CODE_KEY in data:
        data = {k: v for k, v in data.items() if k != CODE_KEY}
    return spec_class(kind).model_validate(data, context=STORED)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths to leaves; lists are leaves (they are compared whole)."""
    if isinstance(data, dict) and data:
        flat: dict[str, Any] = {}
        _flatten_into(flat, data, prefix)
        return flat
    return {prefix: data}


def _flatten_into(flat: dict[str, Any], data: dict[Any, Any], prefix: str) -> None:
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            _flatten_into(flat, value, path)
        else:
            flat[path] = value


def get_path(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def with_path(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with `path` set to `value` (removed when value is None)."""
    head, _, rest = path.partition(".")
    copy = dict(data)
    if not rest:
        if value is None:
            copy.pop(head, None)
        else:
            copy[head] = value
        return copy
    child = copy.get(head)
    copy[head] = with_path(child if isinstance(child, dict) else {}, rest, value)
    return copy
