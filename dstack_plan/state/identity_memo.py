"""Values worked out from an immutable object, remembered while that object lives.

State entries and states are immutable, and some things are worked out of them many times
over (a fleet's parsed record of a hundred hosts, asked for dozens of times a watch tick) or
belong beside them (how a state was made: `state/derivation.py`). Neither is hashable (a
pydantic model holding dicts) nor should its equality, which compares every field, be paid
for a lookup: the memo goes by identity, and forgets an object as it is collected, before
its id can be another object's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """A value per live object, by identity."""

    def __init__(self) -> None:
        self._values: dict[int, V] = {}

    def get(self, key: K) -> V | None:
        """The value remembered for `key` (this very object), or None."""
        return self._values.get(id(key))

    def put(self, key: K, value: V, owner: object = None) -> V:
        """Remember `value` for `key` until `owner` (by default `key` itself; it must support
        weak references, and an owner must hold `key`) is collected; returns `value`."""
        ident = id(key)
        if ident not in self._values:
            # called as the owner goes, which is before `key` can go and its id be reused
            weakref.finalize(key if owner is None else owner, self._values.pop, ident, None)
        self._values[ident] = value
        return value

    def get_or_make(self, key: K, make: Callable[[K], V]) -> V:
        """The value remembered for `key`, made by `make(key)` the first time."""
        found = self._values.get(id(key))
        return found if found is not None else self.put(key, make(key))
