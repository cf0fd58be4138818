"""The guard that keeps resolved secret values out of state files.

Configs reference secrets by name (`${{ secrets.X }}`); the values are resolved at apply time
and must only travel to agents. The caller registers each resolved value here, and backends
refuse to write a state in which any string contains one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dstack_plan.errors import StateError
from dstack_plan.state.model import ResourceState, State

MIN_SUBSTRING_LENGTH = 6
"""Shorter secrets are only caught as whole strings: as substrings they match too much."""


def _unwrap(value: object) -> str:
    # Accept pydantic's SecretStr and the project's Secret type without importing either.
    getter = getattr(value, "get_secret_value", None)
    return getter() if callable(getter) else str(value)


def _strings(data: Any, path: str) -> Iterator[tuple[str, str]]:
    """Yield (where, text) for every string in `data`, keys included.

    A key is reported by its parent's path: the key itself may be the secret. Keys are
    checked before their values, so no reported path ever contains a matching key.
    """
    if isinstance(data, str):
        yield path, data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield f"a key of {path}", key
            child = f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"
            yield from _strings(value, child)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _strings(value, f"{path}[{index}]")


def assert_no_secret_values(state: State, secret_values: Iterable[object]) -> None:
    """Raise StateError if any string in `state` equals or contains a secret value.

    The error names where the value was found, never the value itself.
    """
    _check_entries(state.resources, secret_values)


def _check_entries(entries: Mapping[str, ResourceState], secret_values: Iterable[object]) -> None:
    values = {v for v in (_unwrap(s) for s in secret_values) if v}
    if not values:
        return
    long_values = [v for v in values if len(v) >= MIN_SUBSTRING_LENGTH]
    for address, resource in entries.items():
        root = f"resources[{json.dumps(address)}]"
        for path, text in _strings(resource.model_dump(mode="json"), root):
            if text in values or any(v in text for v in long_values):
                raise StateError(
                    f"refusing to write state: {path} contains the value of a secret."
                    " Secrets must be referenced by name and never stored in state."
                )


class SecretGuard:
    """A mutable set of secret values a backend checks every state against before writing."""

    def __init__(self, values: Iterable[object] = ()) -> None:
        self._values: set[str] = set()
        self.register(*values)

    def register(self, *values: object) -> None:
        """Add resolved secret values (str, or objects with `get_secret_value()`)."""
        self._values.update(v for v in (_unwrap(s) for s in values) if v)

    def __len__(self) -> int:
        return len(self._values)

    def redact(self, text: str, replacement: str) -> str:
        """`text` with every registered value in it replaced (short ones only when whole)."""
        if text in self._values:
            return replacement
        for value in sorted(self._values, key=len, reverse=True):
            if len(value) >= MIN_SUBSTRING_LENGTH:
                text = text.replace(value, replacement)
        return text

    def check(self, state: State) -> None:
        """Raise StateError if `state` contains any registered value."""
        assert_no_secret_values(state, self._values)

    def check_entries(self, entries: Mapping[str, ResourceState]) -> None:
        """`check` of only these entries (by address): what a journal line adds."""
        _check_entries(entries, self._values)
