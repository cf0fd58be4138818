"""Writing what a tick found back into state: small, re-applicable mutations (pure).

Watch never holds the apply lock, so `apply` may commit between watch's read and its write.
Each mutation re-reads the entry it updates and leaves it alone when apply has touched it since
the tick read it (its `updated_at` moved): apply's newer word wins, and the next tick looks
again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from dstack_plan.state.model import State


class Observed(NamedTuple):
    """A run's status and attributes as a tick refreshed them from its agents."""

    read_at: datetime
    """The entry's `updated_at` when the tick read it."""
    status: str
    attributes: dict[str, Any]


def record_observed(observed: Mapping[str, Observed], now: datetime) -> Any:
    """A commit mutation writing each run's observed status and attributes, skipping entries
    that are gone or that apply changed since the tick read them."""

    def mutate(state: State) -> State:
        for address, seen in observed.items():
            current = state.get(address)
            if current is None or current.updated_at != seen.read_at:
                continue
            if current.status == seen.status and current.attributes == seen.attributes:
                continue
            state = state.with_resource(
                current.updated(now=now, status=seen.status, attributes=seen.attributes)
            )
        return state

    return mutate
