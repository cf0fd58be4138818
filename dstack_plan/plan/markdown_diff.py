"""Attribute diffs of the markdown plan, from the JSON plan's `before` / `after`: changed
paths as `-` / `+` lines, a whole spec for a create or a destroy; secrets masked."""

from __future__ import annotations

import json
from typing import Any

from dstack_plan.plan.markdown_escape import code, html, longest_backtick_run
from dstack_plan.plan.normalize import flatten, spec_from_normalized

SENSITIVE = "(sensitive)"
MAX_INLINE_DIFF = 8
"""Diffs longer than this many lines are folded in `<details>`."""


def diff_block(change: dict[str, Any]) -> list[str]:
    """The change's attribute diff as a fenced `diff` block, folded in `<details>` when long;
    nothing when no attribute differs."""
    body = _diff_lines(change)
    if not body:
        return []
    fence = "`" * max(3, longest_backtick_run(body) + 1)
    block = [f"{fence}diff", *body, fence]
    address = change["address"]
    if len(body) <= MAX_INLINE_DIFF:
        return [f"{code(address)}:", "", *block, ""]
    summary = f"<code>{html(address)}</code>: {len(body)} lines"
    return [f"<details><summary>{summary}</summary>", "", *block, "", "</details>", ""]


def _diff_lines(change: dict[str, Any]) -> list[str]:
    inner = change.get("change") or {}
    kind = change.get("type", "")
    before, after = inner.get("before"), inner.get("after")
    if before is None and after is not None:
        return _whole("+", kind, after)
    if after is None and before is not None:
        return _whole("-", kind, before)
    old, new = flatten(before or {}), flatten(after or {})
    forced = {".".join(p) for p in inner.get("replace_paths", [])}
    lines = []
    for path in (".".join(p) for p in inner.get("changed_paths", [])):
        note = "  # forces replacement" if path in forced else ""
        if path in old:
            lines.append(f"- {path} = {_value(old[path])}")
        if path in new:
            lines.append(f"+ {path} = {_value(new[path])}{note}")
    return lines


def _whole(sign: str, kind: str, spec: dict[str, Any]) -> list[str]:
    flat = {k: v for k, v in flatten(_shown(kind, spec)).items() if v not in ({}, [], None)}
    return [f"{sign} {key} = {_value(value)}" for key, value in flat.items()]


def _shown(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`type`, `name`, `resources` and what differs from the kind's defaults (as the terminal
    plan shows a create); the whole spec when it is not one this version can read."""
    try:
        explicit = spec_from_normalized(kind, spec).model_dump(
            mode="json", exclude_defaults=True, exclude_none=True
        )
    except (ValueError, KeyError):
        return spec
    head = {k: spec[k] for k in ("type", "name", "resources") if k in spec}
    return head | {k: v for k, v in explicit.items() if k not in head}


def _value(value: Any) -> str:
    # Specs hold secret references, never values; they are masked all the same, as in the
    # terminal plan, so that a comment never quotes how a secret is wired.
    if isinstance(value, str) and "${{ secrets." in value:
        return SENSITIVE
    if isinstance(value, list) and any(isinstance(v, str) and "${{ secrets." in v for v in value):
        return SENSITIVE
    return json.dumps(value, ensure_ascii=False)
