"""Turn pydantic validation errors into located, human messages."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:  # the locator (ruamel.yaml) is only imported when there is an error
    from dstack_plan.config.locate import PathItem, Target


class PendingIssue(NamedTuple):
    """A problem found in a document, waiting for its position to be looked up."""

    document: int
    path: tuple[PathItem, ...]
    message: str
    target: Target = "value"


def issues_from_validation(
    error: ValidationError, document: int, data: Any, model: type[BaseModel]
) -> Iterator[PendingIssue]:
    seen: set[tuple[tuple[PathItem, ...], Target]] = set()
    for err in error.errors(include_url=False):
        path, complete = _data_path(data, err["loc"])
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
            message = _message(err)
            target = "key" if conflict else "value"
        if (path, target) in seen:
            continue  # a union reports each failed alternative; the first one says enough
        seen.add((path, target))
        where = ".".join(str(p) for p in path)
        prefix = f"{where}: " if where and kind != "extra_forbidden" and not conflict else ""
        yield PendingIssue(document, path, prefix + message, target)


def _error_of(err: dict[str, Any]) -> Any:
    return err.get("ctx", {}).get("error")


def _conflict_field(
    err: dict[str, Any], data: Any, path: tuple[PathItem, ...]
) -> tuple[PathItem, ...]:
    """Point a cross-field error at the first of its keys that the document has."""
    error = err.get("ctx", {}).get("error")
    fields = getattr(error, "fields", ())
    node = data
    for item in path:
        node = node[item]
    item = getattr(error, "item", None)
    if item is not None and isinstance(node, dict | list):
        inside = item in node if isinstance(node, dict) else 0 <= int(item) < len(node)
        return (*path, item) if inside else path
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
        elif isinstance(item, str) and ("[" in item or item[:1].isupper() or item in _TAGS):
            continue
        else:
            return tuple(path), False
    return tuple(path), True


_TAGS = {"str", "int", "float", "bool", "list", "dict", "tuple", "none", "literal", "union"}


def _message(err: dict[str, Any]) -> str:
    msg: str = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    if err["type"] in ("string_type", "int_type", "bool_type", "float_type", "model_type"):
        got = type(err.get("input")).__name__
        got = {"NoneType": "null", "dict": "mapping", "list": "list", "str": "string"}.get(
            got, got
        )
        return f"{msg[0].lower()}{msg[1:]}, got {got}"
    return msg[0].lower() + msg[1:]


def _suggestion(model: type[BaseModel], path: tuple[PathItem, ...]) -> str:
    known = _known_keys(model, path[:-1])
    if not known:
        return ""
    close = difflib.get_close_matches(str(path[-1]), known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _known_keys(model: type[BaseModel], path: tuple[PathItem, ...]) -> list[str]:
    current: Any = model
    for item in path:
        if isinstance(item, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(item))
        if field is None:
            return []
        current = _first_model(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _first_model(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, tuple, list):
        for arg in typing.get_args(annotation):
            found = _first_model(arg)
            if found is not None:
                return found
    return None
