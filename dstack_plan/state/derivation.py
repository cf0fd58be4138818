"""Which addresses a state changed since an earlier one, remembered as it is derived.

A commit writes what its mutation changed (a journal line, `state/journal.py`). Finding that
by comparing two states of 10,000 resources costs about 1.5 ms, paid by every commit: an
apply of 10,000 runs makes about 10,000 commits, so those scans grew with the square of the
runs. A state made by `State.with_resource` or `State.without` instead has its making
recorded here: the state it came from and the address touched, folded over the steps before,
so the change from an ancestor costs only the addresses touched.

The records live beside the states (`state/identity_memo.py`), not in them: a state's
equality and copies stay those of its fields. Ancestors are held by weak reference, so no
state is kept alive by the ones made from it.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from dstack_plan.state.identity_memo import IdentityMemo

MAX_STEPS = 256
"""Ancestors remembered: a batch of group-committed mutations is a few steps each."""


class _Derivable(Protocol):
    @property
    def resources(self) -> Mapping[str, Any]: ...


Steps = tuple[tuple["weakref.ReferenceType[_Derivable]", frozenset[str]], ...]
"""For each ancestor (nearest first), the addresses touched since it."""


_RECORDS: IdentityMemo[Mapping[str, Any], Steps] = IdentityMemo()
"""By the resources dict a step made, for as long as the state made with it lives: the
states that share it (copies that changed only the serial, as a backend's write makes) share
its record."""


def record(state: _Derivable, parent: _Derivable, address: str) -> None:
    """Remember that `state` (holding a resources dict of its own) was made from `parent`
    by adding, replacing or removing the entry at `address`."""
    touched = frozenset((address,))
    inherited = (_RECORDS.get(parent.resources) or ())[: MAX_STEPS - 1]
    steps = ((weakref.ref(parent), touched), *((ref, seen | touched) for ref, seen in inherited))
    # Copies sharing the dict may outlive `state`: they are then compared in full.
    _RECORDS.put(state.resources, steps, owner=state)


def touched_since(state: _Derivable, ancestor: _Derivable) -> frozenset[str] | None:
    """The addresses whose entries may differ between `ancestor` and `state` (a superset: a
    step may have been undone), when `state` was made from it step by step; None when not
    known. States match by their resources dict: a copy that changed only the serial holds
    the same resources."""
    if state.resources is ancestor.resources:
        return frozenset()
    found = _RECORDS.get(state.resources)
    if found is None:
        return None
    for ref, touched in found:
        earlier = ref()
        if earlier is not None and earlier.resources is ancestor.resources:
            return touched
    return None
