"""Attribute diffs of the markdown plan, from the JSON plan's `before` / `after`: changed
paths as `-` / `+` lines, a changed list as the elements added, removed or changed
(`plan.list_diff`, as the terminal plan), a whole spec for a create or a destroy; secrets
masked."""

from __future__ import annotations

from typing import Any

from dstack_plan.plan.list_diff import Element, Entry, Hidden, list_diff, value_text
from dstack_plan.plan.markdown_escape import code, html, longest_backtick_run
from dstack_plan.plan.normalize import flatten, spec_from_normalized

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
        entries = list_diff(kind, path, before or {}, after or {})
        if entries is not None:
            lines += [f"  {path} = [{note}", *_list_entries(entries), "  ]"]
            continue
        if path in old:
            lines.append(f"- {path} = {value_text(old[path])}")
        if path in new:
            lines.append(f"+ {path} = {value_text(new[path])}{note}")
    return lines


def _list_entries(entries: tuple[Entry, ...]) -> list[str]:
    """A changed list's elements, inside its `[` and `]` lines: as in the terminal plan, but
    a changed key is a `-` and a `+` line (what a `diff` block colours), not `~`."""
    lines = []
    for entry in entries:
        if isinstance(entry, Hidden):
            lines.append(f"    {entry.text}")
        elif not entry.mapping:
            lines.append(f"{entry.sign or ' '}   {value_text(entry.value)}")
        else:
            sign = entry.sign if entry.sign in ("+", "-") else " "
            lines += [f"{sign}   {{", *_element_fields(entry), f"{sign}   }}"]
    return lines


def _element_fields(element: Element) -> list[str]:
    lines = []
    for field in element.fields:
        if field.sign in ("-", "~"):
            lines.append(f"-     {field.key} = {value_text(field.old)}")
        if field.sign in ("+", "~"):
            lines.append(f"+     {field.key} = {value_text(field.new)}")
        if not field.sign:
            lines.append(f"      {field.key} = {value_text(field.new)}")
    if element.hidden:
        lines.append(f"      {Hidden(element.hidden, 'attribute').text}")
    return lines


def _whole(sign: str, kind: str, spec: dict[str, Any]) -> list[str]:
    flat = {k: v for k, v in flatten(_shown(kind, spec)).items() if v not in ({}, [], None)}
    return [f"{sign} {key} = {value_text(value)}" for key, value in flat.items()]


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
