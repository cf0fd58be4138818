"""`env:` — a list of `KEY=VALUE` / bare `KEY`, or a mapping; normalised to a sorted mapping."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema

from dstack_plan.config.base import ItemError

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _scalar_to_str(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise ItemError(f"expected a string or a number, got {type(value).__name__}", key)


def _check_key(key: Any, item: str | int) -> str:
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ItemError(f"invalid env variable name {key!r}", item)
    return key


def parse_env(value: Any) -> dict[str, str | None]:
    """`None` as a value means "take it from the environment of whoever applies"."""
    items: list[tuple[str, str | None]] = []
    if isinstance(value, dict):
        for key, val in value.items():
            key = _check_key(key, key)
            items.append((key, None if val is None else _scalar_to_str(val, key)))
    elif isinstance(value, list):
        for index, entry in enumerate(value):
            if not isinstance(entry, str):
                raise ItemError(f"expected a KEY=VALUE or KEY string, got {entry!r}", index)
            key, eq, val = entry.partition("=")
            items.append((_check_key(key, index), val if eq else None))
    else:
        raise ValueError(f"expected a list of KEY=VALUE / KEY entries or a mapping, got {value!r}")
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            raise ValueError(f"variable {key!r} is set twice")
        seen.add(key)
    return dict(sorted(items))


Env = Annotated[
    dict[str, str | None],
    BeforeValidator(parse_env),
    WithJsonSchema(
        {
            "anyOf": [
                {
                    "type": "array",
                    "items": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*(=.*)?$"},
                },
                {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
                },
            ]
        }
    ),
    Field(description="Environment variables: KEY=VALUE, or bare KEY to take from the caller"),
]
