"""Turn pydantic validation errors into located messages in the config's own terms.

No pydantic wording reaches the user: type mismatches say what the key takes
(`commands: expected a list of strings, got 'echo hi'`), constraints say the bound
(`priority: must be at most 100, got 200`), and the alternatives of a union are reported
once, as the alternative the value looked like or as one "expected A or B".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ValidationError

from dstack_plan.config.introspect import (
    TYPE_MISMATCHES,
    expected_at,
    expected_from_error,
    join_or,
    known_keys,
)
from dstack_plan.config.units import describe

if TYPE_CHECKING:  # the locator is only imported when there is an error
    from pydantic_core import ErrorDetails

    from dstack_plan.config.locate import PathItem, Target


class PendingIssue(NamedTuple):
    """A problem found in a document, waiting for its position to be looked up."""

    document: int
    path: tuple[PathItem, ...]
    message: str
    target: Target = "value"


def issues_from_validation(
    error: ValidationError,
    document: int,
    data: Any,
    model: type[BaseModel],
    max_errors: int | None = None,
) -> Iterator[PendingIssue]:
    """One located issue per problem pydantic found (union alternatives merged into one),
    from the first `max_errors` of pydantic's errors (a union reports one per alternative)."""
    seen: set[tuple[tuple[PathItem, ...], Target]] = set()
    # messages are written from `data`: pydantic's copies of the inputs would only cost memory
    errors = error.errors(include_url=False, include_input=False)[:max_errors]
    for entry in _resolve_unions([_Entry.of(e, data) for e in errors]):
        err = entry.err
        path, complete = entry.data_path, entry.complete
        kind = err["type"]
        located = _conflict_field(err, data, path)
        conflict, path = located != path and not hasattr(_error_of(err), "item"), located
        if kind == "extra_forbidden" and complete:
            key = path[-1]
            message = f"unknown key {key!r}" + _suggestion(model, path)
            target: Target = "key"
        elif kind == "missing":
            missing = err["loc"][-1]
            message = f"missing required key {missing!r}"
            target = "key"
        else:
            message = _message(err, model, path, data, entry.alternatives)
            target = "key" if conflict else "value"
        if (path, target) in seen:
            continue
        seen.add((path, target))
        where = ".".join(str(p) for p in path)
        prefix = f"{where}: " if where and kind != "extra_forbidden" and not conflict else ""
        yield PendingIssue(document, path, prefix + message, target)


# --- union alternatives -----------------------------------------------------------------------


@dataclass
class _Entry:
    """One pydantic error, with which items of its `loc` are union tags rather than data."""

    err: ErrorDetails
    tags: tuple[bool, ...]
    """Per `loc` item: True for a union alternative's tag (`str`, `FleetRef`, `tuple[...]`)."""
    data_path: tuple[PathItem, ...]
    complete: bool
    start: int = 0
    """Tags before this `loc` index are already resolved."""
    alternatives: tuple[ErrorDetails, ...] = ()
    """For a union whose every alternative mismatched: their errors, reported as one."""

    @classmethod
    def of(cls, err: ErrorDetails, data: Any) -> _Entry:
        tags: list[bool] = []
        node = data
        walking = True
        for item in err["loc"]:
            if walking and isinstance(node, dict) and item in node:
                node = node[item]
                tags.append(False)
            elif (
                walking
                and isinstance(node, list)
                and isinstance(item, int)
                and 0 <= item < len(node)
            ):
                node = node[item]
                tags.append(False)
            elif isinstance(item, str) and _is_tag(item):
                tags.append(True)
            else:
                walking = False
                tags.append(False)
        path, complete = _data_path(data, err["loc"])
        return cls(err, tuple(tags), path, complete)

    def next_tag(self) -> int | None:
        return next((i for i in range(self.start, len(self.tags)) if self.tags[i]), None)

    def deep(self, tag: int) -> bool:
        """Whether the error lies inside the value (the value had this alternative's shape)."""
        return any(not t for t in self.tags[tag + 1 :])


def _resolve_unions(entries: list[_Entry]) -> list[_Entry]:
    """Keep, for each union, the errors of the alternative the value was meant as.

    An alternative whose errors lie inside the value (a mapping that matched a model's shape)
    wins over one whose own validator refused the value, which wins over plain type
    mismatches; when every alternative only mismatched, one message lists them all.
    """
    result: list[_Entry] = []
    pending = entries
    while pending:
        groups: dict[tuple[Any, ...], list[tuple[int, _Entry]]] = {}
        for entry in pending:
            tag = entry.next_tag()
            if tag is None:
                result.append(entry)
            else:
                groups.setdefault(tuple(entry.err["loc"][:tag]), []).append((tag, entry))
        pending = []
        for members in groups.values():
            pending.extend(_choose(members))
    order = {id(e.err): i for i, e in enumerate(entries)}
    return sorted(result, key=lambda e: order.get(id(e.err), len(order)))


def _choose(members: list[tuple[int, _Entry]]) -> list[_Entry]:
    """The errors to keep of one union's failed alternatives (`members`: tag index, error)."""
    by_alternative: dict[Any, list[_Entry]] = {}
    for tag, entry in members:
        entry.start = tag + 1
        by_alternative.setdefault(entry.err["loc"][tag], []).append(entry)
    tag = members[0][0]
    for good in (
        lambda e: e.deep(tag),
        lambda e: e.err["type"] not in TYPE_MISMATCHES,
    ):
        for alternative in by_alternative.values():
            if any(good(e) for e in alternative):
                return alternative
    first = members[0][1]
    first.start = len(first.tags)  # nothing left to resolve: the union is the whole story
    first.alternatives = tuple(e.err for _, e in members)
    return [first]


def _is_tag(item: str) -> bool:
    return "[" in item or item[:1].isupper() or item in _TAGS


def _error_of(err: ErrorDetails) -> Any:
    return err.get("ctx", {}).get("error")


def _conflict_field(
    err: ErrorDetails, data: Any, path: tuple[PathItem, ...]
) -> tuple[PathItem, ...]:
    """Point a cross-field error at the first of its keys that the document has."""
    error = _error_of(err)
    fields = getattr(error, "fields", ())
    node = data
    for item in path:
        node = node[item]
    item = getattr(error, "item", None)
    if item is not None:
        located = path
        for step in item if isinstance(item, tuple) else (item,):
            if isinstance(node, dict) and step in node:
                node = node[step]
            elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
                node = node[step]
            else:
                break
            located = (*located, step)
        return located
    for field in fields:
        if isinstance(node, dict) and field in node:
            return (*path, field)
    return path


def _data_path(data: Any, loc: tuple[Any, ...]) -> tuple[tuple[PathItem, ...], bool]:
    """Keep the loc items that exist in the data; drop pydantic's union/validator tags."""
    path: list[PathItem] = []
    node = data
    for item in loc:
        if isinstance(node, dict) and item in node:
            path.append(item)
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            path.append(item)
            node = node[item]
        elif isinstance(item, str) and _is_tag(item):
            continue
        else:
            return tuple(path), False
    return tuple(path), True


_TAGS = {"str", "int", "float", "bool", "list", "dict", "tuple", "none", "literal", "union"}


# --- messages ---------------------------------------------------------------------------------


def _value_at(data: Any, path: tuple[PathItem, ...]) -> Any:
    node = data
    for item in path:
        node = node[item]
    return node


def _message(
    err: ErrorDetails,
    model: type[BaseModel],
    path: tuple[PathItem, ...],
    data: Any,
    alternatives: tuple[ErrorDetails, ...] = (),
) -> str:
    kind = "union_mismatch" if alternatives else err["type"]
    ctx: dict[str, Any] = dict(err.get("ctx") or {})
    if kind in ("value_error", "assertion_error"):
        msg = str(err["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            msg = msg.removeprefix(prefix)
        return msg
    got = describe(_value_at(data, path)) if path else None
    got_text = f", got {got}" if got is not None else ""
    if kind in _BOUNDS:
        words, key = _BOUNDS[kind]
        return f"must be {words} {_number(ctx.get(key))}{got_text}"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return _length_message(kind, ctx)
    expected = expected_at(model, path)
    if kind == "union_mismatch" and expected is None:
        texts = [expected_from_error(e) for e in alternatives]
        expected = join_or([t for i, t in enumerate(texts) if t and t not in texts[:i]]) or None
    if expected is None:
        expected = expected_from_error(err)
    if kind == "literal_error" and "expected" in ctx:
        expected = str(ctx["expected"])
    if kind == "int_from_float":
        expected = "a whole number"
    if kind == "finite_number":
        expected = "a finite number"
    if expected:
        return f"expected {expected}{got_text}"
    return f"invalid value{' ' + got if got else ''}"


_BOUNDS = {
    "greater_than": ("greater than", "gt"),
    "greater_than_equal": ("at least", "ge"),
    "less_than": ("less than", "lt"),
    "less_than_equal": ("at most", "le"),
    "multiple_of": ("a multiple of", "multiple_of"),
}


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _length_message(kind: str, ctx: dict[str, Any]) -> str:
    unit = "character" if kind.startswith("string") else "item"
    if kind.endswith("too_short"):
        n = int(ctx.get("min_length", 1))
        if n == 1:
            return "must not be empty"
        return f"must have at least {n} {unit}s"
    n = int(ctx.get("max_length", 0))
    actual = ctx.get("actual_length")
    got = f", got {actual}" if actual is not None else ""
    return f"must have at most {n} {unit}{'' if n == 1 else 's'}{got}"


def _suggestion(model: type[BaseModel], path: tuple[PathItem, ...]) -> str:
    known = known_keys(model, path[:-1])
    if not known:
        return ""
    close = difflib.get_close_matches(str(path[-1]), known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
