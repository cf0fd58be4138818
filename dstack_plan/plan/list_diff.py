"""How a plan diff shows values: secret references masked, and a changed list attribute as the
elements added, removed or changed (as Terraform shows lists), never the whole list twice.

One decision for both renderings: the terminal plan (`plan/render.py`) and the markdown plan
(`plan/markdown_diff.py`) only lay out what `list_diff` returns.

- Elements are matched by identity: a mapping with a `hostname` (an SSH host) or a `name` is
  the same element before and after when that value is (with the `port` too when one hostname
  serves several hosts); any other element only when it is equal. Matching keeps the list's
  order (a longest common subsequence, as `difflib` finds it).
- A matched element that differs is *changed*: only its changed keys are shown, with its
  identity key unmarked so that the reader knows which element it is.
- Unchanged elements are counted, not shown, except in a list of plain values (`commands`),
  where the element just before and just after each change is shown for context, as
  Terraform does: an insertion in the middle of a script says where it goes.
- A mapping element's keys are in the spec model's field order (the order of a normalised
  spec), whatever order the stored spec has: a saved plan's JSON sorts keys, a fresh plan does
  not, and the same change must read the same in both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from dstack_plan.plan.normalize import flatten, get_path, spec_from_normalized

SENSITIVE = "(sensitive)"
_SECRET_MARK = "${{ secrets."


def value_text(value: Any) -> str:
    """`value` as a plan shows it: JSON, `null` for none, `(sensitive)` for a value holding a
    secret reference. Specs hold references, never secret values; they are masked all the
    same, so that a plan (or a pull-request comment) never quotes how a secret is wired."""
    if value is None:
        return "null"
    if isinstance(value, str) and _SECRET_MARK in value:
        return SENSITIVE
    if isinstance(value, list) and any(isinstance(v, str) and _SECRET_MARK in v for v in value):
        return SENSITIVE
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Field:
    """One key of a mapping element (dotted when nested, as plan paths are)."""

    sign: str
    """`+` added, `-` removed, `~` changed, `""` unchanged (shown: the element's identity)."""
    key: str
    old: Any
    new: Any


@dataclass(frozen=True)
class Element:
    """One element of the list that is shown."""

    sign: str
    """`+` added, `-` removed, `~` changed, `""` unchanged (shown as context)."""
    old: Any
    new: Any
    fields: tuple[Field, ...] = ()
    """A mapping element's keys to show, in order; empty for a plain value."""
    hidden: int = 0
    """A changed mapping element: how many of its keys are unchanged and not shown."""

    @property
    def mapping(self) -> bool:
        return bool(self.fields)

    @property
    def value(self) -> Any:
        """A plain element's value (the new one, the old one when it was removed)."""
        return self.old if self.sign == "-" else self.new


@dataclass(frozen=True)
class Hidden:
    """Unchanged things left out, counted."""

    count: int
    noun: str = "element"

    @property
    def text(self) -> str:
        return f"# ({self.count} unchanged {self.noun}{'s' if self.count != 1 else ''} hidden)"


Entry = Element | Hidden

_IDENTITIES: tuple[tuple[str, ...], ...] = (("hostname",), ("hostname", "port"), ("name",))
"""Keys that identify a mapping element, tried in order: the first whose value is unique in
the list before and in the list after (an SSH host by `hostname`, by `hostname` and `port`
when several hosts share an address)."""


def list_diff(
    kind: str, path: str, before: dict[str, Any], after: dict[str, Any]
) -> tuple[Entry, ...] | None:
    """What the plan shows of the list at dotted `path` of a resource's `before` and `after`
    specs (`kind` orders a mapping element's keys); None when it is not a list on both sides
    (the value is then shown whole, as any other attribute)."""
    old, new = get_path(before, path), get_path(after, path)
    if not isinstance(old, list) or not isinstance(new, list):
        return None
    old_keys, new_keys = _match_keys(old, new)
    old_order = _key_order(kind, before, path, old)
    new_order = _key_order(kind, after, path, new)
    matcher = SequenceMatcher(None, old_keys, new_keys, autojunk=False)
    steps: list[Element] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                steps.append(_matched(old[i], new[j], new_keys[j], (old_order[i], new_order[j])))
            continue
        steps += [_whole("-", old[i], old_order[i]) for i in range(i1, i2)]
        steps += [_whole("+", new[j], new_order[j]) for j in range(j1, j2)]
    context = not any(isinstance(v, dict) for v in (*old, *new))
    return _with_hidden(steps, context)


def _match_keys(old: list[Any], new: list[Any]) -> tuple[list[Any], list[Any]]:
    """A key per element: equal keys are the same element. A mapping's identity is a tuple
    `(fields, values...)`, anything else is its content (a string)."""
    keys: list[list[Any]] = [[_content(v) for v in old], [_content(v) for v in new]]
    for fields in _IDENTITIES:
        identities = [[_identity(v, fields) for v in old], [_identity(v, fields) for v in new]]
        for side_keys, side_identities in zip(keys, identities, strict=True):
            for index, identity in enumerate(side_identities):
                unique = all(ids.count(identity) <= 1 for ids in identities)
                if identity is not None and unique and isinstance(side_keys[index], str):
                    side_keys[index] = identity
    return keys[0], keys[1]


def _identity(value: Any, fields: tuple[str, ...]) -> tuple[Any, ...] | None:
    if not isinstance(value, dict) or fields[0] not in value:
        return None
    return (fields, *(_content(value.get(f)) for f in fields))


def _content(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _key_order(kind: str, spec: dict[str, Any], path: str, values: list[Any]) -> list[list[str]]:
    """Each element's flattened keys in the spec model's field order (the stored order when
    the spec cannot be read back: an older version's)."""
    stored = [list(_flat(v)) if isinstance(v, dict) else [] for v in values]
    if not any(stored):
        return stored
    try:
        model = spec_from_normalized(kind, spec).model_dump(mode="json", exclude_none=True)
    except (ValueError, KeyError, TypeError):
        return stored
    canonical = get_path(model, path)
    if not isinstance(canonical, list) or len(canonical) != len(values):
        return stored
    ordered = []
    for keys, element in zip(stored, canonical, strict=True):
        first = [k for k in _flat(element) if k in keys] if isinstance(element, dict) else []
        ordered.append(first + [k for k in keys if k not in first])
    return ordered


def _flat(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flatten(value).items() if v not in ({}, [], None)}


def _whole(sign: str, value: Any, order: list[str]) -> Element:
    old, new = (value, None) if sign == "-" else (None, value)
    flat = _flat(value) if isinstance(value, dict) else {}
    fields = tuple(
        Field(sign, k, flat[k] if sign == "-" else None, flat[k] if sign == "+" else None)
        for k in order
        if k in flat
    )
    return Element(sign, old, new, fields)


def _matched(old: Any, new: Any, key: Any, orders: tuple[list[str], list[str]]) -> Element:
    if old == new or not isinstance(key, tuple):
        return Element("", old, new)
    identity: tuple[str, ...] = key[0]
    before, after = _flat(old), _flat(new)
    keys = orders[1] + [k for k in orders[0] if k not in orders[1]]
    fields = []
    for name in keys:
        a, b = before.get(name), after.get(name)
        if name in identity and a == b:
            fields.append(Field("", name, a, b))
        elif a != b:
            fields.append(Field("+" if a is None else "-" if b is None else "~", name, a, b))
    return Element("~", old, new, tuple(fields), hidden=len(keys) - len(fields))


def _with_hidden(steps: list[Element], context: bool) -> tuple[Entry, ...]:
    """The changed elements, unchanged ones counted; with `context`, the unchanged element
    just before and just after each change shown (Terraform's list of plain values)."""
    changed = [i for i, s in enumerate(steps) if s.sign]
    shown = set(changed)
    if context:
        shown |= {i + d for i in changed for d in (-1, 1) if 0 <= i + d < len(steps)}
    entries: list[Entry] = []
    unchanged = 0
    for index, step in enumerate(steps):
        if index not in shown:
            unchanged += 1
            continue
        if unchanged and context:
            entries.append(Hidden(unchanged))
            unchanged = 0
        entries.append(step)
    if unchanged:
        entries.append(Hidden(unchanged))
    return tuple(entries)
