"""Writes that carry a whole state over (`state push`, `state migrate`), not a change to it.

A normal write sets serial = stored + 1 and never crosses lineages (`prepare_write`). Inside
`importing()` the written state keeps its own serial when that is newer (a migrated state
keeps its serial; the stored serial never goes down), and with `other_lineage=True`
(`state push --force`) it may replace a state of another lineage. Backends need nothing
for it: the rule lives in `prepare_write`, which every backend calls. A ContextVar, so it
follows `asyncio.to_thread` into the commit's worker thread and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from dstack_plan.errors import StateError
from dstack_plan.state.model import State

_MODE: ContextVar[bool | None] = ContextVar("dstack_plan_state_importing", default=None)


@contextmanager
def importing(*, other_lineage: bool = False) -> Iterator[None]:
    """Writes in the body are imports (see the module docstring)."""
    token = _MODE.set(other_lineage)
    try:
        yield
    finally:
        _MODE.reset(token)


def active() -> bool:
    """True inside `importing()`."""
    return _MODE.get() is not None


def prepare_import(current: State | None, proposed: State, location: str) -> State | None:
    """What `prepare_write` persists for an import; None when it changes nothing."""
    if current is None:
        if not proposed.resources and proposed.serial == 0:
            return None
        return proposed.model_copy(update={"serial": max(proposed.serial, 1)})
    if proposed.lineage != current.lineage and not _MODE.get():
        raise StateError(
            f"{location}: refusing to overwrite state of lineage {current.lineage} with"
            f" unrelated state of lineage {proposed.lineage}"
        )
    if (
        proposed.lineage == current.lineage
        and proposed.same_content(current)
        and proposed.serial <= current.serial
    ):
        return None
    return proposed.model_copy(update={"serial": max(proposed.serial, current.serial + 1)})
