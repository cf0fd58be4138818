"""Check JSON objects against the official `kubernetes` client's models (tests/infra/fake_kube.py).

The client's generated models describe every field of every kind: `openapi_types` maps an
attribute to its type (`str`, `int`, `bool`, `float`, `object`, `datetime`, `bytes`,
`List[V1Container]`, `Dict[str, str]`, a model name) and `attribute_map` maps it to its JSON
key. `check` walks an object along them and lists every problem with its field path, e.g.
`spec.template.spec.containers[0].resourcez: not a field of V1Container`. The fake answers a
request body with problems 422, and asserts its own answers have none.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from typing import Any

import kubernetes.client

_LIST = re.compile(r"^(?:List\[|list\[)(.*)\]$")
_DICT = re.compile(r"^(?:Dict\[|dict\()str, (.*)[\])]$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:?\d{2})?$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# Python types of JSON values, by the client's primitive type names (bool is not an int here:
# JSON keeps them apart, and so does the API server)
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
}


def check(obj: Any, model: str, path: str = "", *, required: bool = True) -> list[str]:
    """The problems of the JSON value `obj` read as the client's type `model` (a model name
    such as `V1Job`, or a type expression such as `List[V1Pod]`), each prefixed with its
    field path under `path`. Unknown keys are problems; so are missing required fields
    unless `required` is False (a patch body names only what it changes). `null` is
    accepted anywhere: the API server reads it as an absent field."""
    problems: list[str] = []
    _check(obj, model, path, required, problems)
    return problems


def require_valid(obj: Any, model: str) -> None:
    """Raise AssertionError listing every problem `check` finds in `obj` as `model`."""
    problems = check(obj, model)
    if problems:
        raise AssertionError(f"not a valid {model}:\n  " + "\n  ".join(problems))


def is_model(name: str) -> bool:
    """Whether the client has a model of this name (e.g. `V1Pod`)."""
    return _fields(name) is not None


@functools.cache
def _fields(model: str) -> tuple[dict[str, str], frozenset[str]] | None:
    """JSON key → type of `model`'s fields, and the JSON keys it requires."""
    cls = getattr(kubernetes.client, model, None)
    types = getattr(cls, "openapi_types", None)
    if cls is None or not isinstance(types, dict):
        return None
    keys = cls.attribute_map
    by_key = {keys[attr]: kind for attr, kind in types.items()}
    # pydantic knows which fields have no default (the OpenAPI `required` list)
    pydantic_fields = getattr(cls, "model_fields", {})
    needed = frozenset(
        keys[attr] for attr, info in pydantic_fields.items() if attr in keys and info.is_required()
    )
    return by_key, needed


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean"}
    kind = names.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:40] + '...' if len(text) > 40 else text}"


def _check(value: Any, kind: str, path: str, required: bool, problems: list[str]) -> None:
    where = path or "(root)"
    if value is None:
        return
    if m := _LIST.match(kind):
        if not isinstance(value, list):
            problems.append(f"{where}: expected an array, got {_describe(value)}")
            return
        for i, item in enumerate(value):
            _check(item, m.group(1), f"{path}[{i}]", required, problems)
        return
    if m := _DICT.match(kind):
        if not isinstance(value, dict):
            problems.append(f"{where}: expected an object, got {_describe(value)}")
            return
        for key, item in value.items():
            _check(item, m.group(1), f"{path}[{key!r}]", required, problems)
        return
    if kind in _PRIMITIVES:
        if isinstance(value, bool) and kind != "bool" or not isinstance(value, _PRIMITIVES[kind]):
            problems.append(f"{where}: expected {kind}, got {_describe(value)}")
        return
    if kind == "object":
        return  # int-or-string, or free-form
    if kind in ("datetime", "date"):
        pattern = _RFC3339 if kind == "datetime" else _DATE
        if not isinstance(value, str) or not pattern.match(value):
            problems.append(f"{where}: expected an RFC 3339 {kind}, got {_describe(value)}")
        return
    if kind == "bytes":
        _check_base64(value, where, problems)
        return
    _check_model(value, kind, path, required, problems)


def _check_base64(value: Any, where: str, problems: list[str]) -> None:
    if not isinstance(value, str):
        problems.append(f"{where}: expected a base64 string, got {_describe(value)}")
        return
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        problems.append(f"{where}: not valid base64: {_describe(value)}")


def _check_model(value: Any, model: str, path: str, required: bool, problems: list[str]) -> None:
    where = path or "(root)"
    fields = _fields(model)
    if fields is None:
        problems.append(f"{where}: unknown type {model!r} in the client's models")
        return
    if not isinstance(value, dict):
        problems.append(f"{where}: expected an object ({model}), got {_describe(value)}")
        return
    by_key, needed = fields
    for key, item in value.items():
        if key not in by_key:
            problems.append(f"{_at(path, str(key))}: not a field of {model}")
            continue
        _check(item, by_key[key], _at(path, key), required, problems)
    if required:
        for key in sorted(needed):
            if value.get(key) is None:
                problems.append(f"{_at(path, key)}: required by {model}, missing")
