"""`env:` — a list of `KEY=VALUE` / bare `KEY`, or a mapping; normalised to a sorted mapping.

Names follow dstack 0.22.5's parser: the list form takes identifiers only (its pattern
`^[A-Za-z_][A-Za-z0-9_]*(=.*)?$`), the mapping form any key (`MY-VAR`, `spring.profiles.active`),
which Docker and execve(2) pass on as they are. Here a mapping key must still be able to be a
variable at all: not empty, no `=` (Docker would split `A=B: x` into A=`B=x`, Python's
subprocess refuses it), no control characters, and at most `NAME_MAX` characters (what the
agent takes: `dstack_plan.agent.spec`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema

from dstack_plan.config.base import ItemError

NAME_MAX = 256
_LIST_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""A name in the list form, as dstack's parser takes it."""
_MAP_KEY_RE = re.compile(r"^[^=\x00-\x1f\x7f]+$")
"""A name in the mapping form: anything a variable can be named (the agent's rule too)."""


def _scalar_to_str(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise ItemError(f"expected a string or a number, got {type(value).__name__}", key)


def _shown(key: str) -> str:
    return repr(key if len(key) <= 64 else key[:64] + "...")


def _check_map_key(key: Any, item: str | int) -> str:
    if isinstance(key, int | float) and not isinstance(key, bool):
        key = str(key)  # a YAML number as a key is its text, as in dstack (`{1: x}`)
    if not isinstance(key, str) or not _MAP_KEY_RE.fullmatch(key):
        shown = _shown(key) if isinstance(key, str) else repr(key)
        raise ItemError(
            f"invalid env variable name {shown}: a name is not empty and has no '=' and no "
            "control characters",
            item,
        )
    if len(key) > NAME_MAX:
        raise ItemError(
            f"invalid env variable name {_shown(key)}: at most {NAME_MAX} characters", item
        )
    return key


def _check_list_key(key: str, item: int) -> str:
    if not _LIST_KEY_RE.fullmatch(key):
        hint = ""
        if _MAP_KEY_RE.fullmatch(key) and len(key) <= 64:
            hint = f"; write env as a mapping ({key}: value) for other names"
        raise ItemError(
            f"invalid env variable name {_shown(key)}: in a KEY=VALUE list a name has letters, "
            f"digits and '_', not first a digit (as in dstack){hint}",
            item,
        )
    if len(key) > NAME_MAX:
        raise ItemError(
            f"invalid env variable name {_shown(key)}: at most {NAME_MAX} characters", item
        )
    return key


def parse_env(value: Any) -> dict[str, str | None]:
    """`None` as a value means "take it from the environment of whoever applies"."""
    items: list[tuple[str, str | None]] = []
    if isinstance(value, dict):
        for key, val in value.items():
            key = _check_map_key(key, key)
            items.append((key, None if val is None else _scalar_to_str(val, key)))
    elif isinstance(value, list):
        for index, entry in enumerate(value):
            if not isinstance(entry, str):
                raise ItemError(f"expected a KEY=VALUE or KEY string, got {entry!r}", index)
            key, eq, val = entry.partition("=")
            items.append((_check_list_key(key, index), val if eq else None))
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
