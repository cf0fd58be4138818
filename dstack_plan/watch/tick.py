"""What an actor of the reconcile loop is given and gives back.

Each rule watch carries out (stopping a gang, enforcing limits, retrying, rolling a service,
placing queued runs, releasing idle machines, marking hosts unreachable) is an `Actor`: one
object, in its own module, asked once per tick while this process holds the lease. It reads
the `Tick` (the state as refreshed and as the actors before it left it, what every host
answered, the time) and returns what it changed (`Acted`). The loop folds each actor's changed
entries into the state the next actor sees, and commits them all at the end of the tick.

An actor may keep memory between ticks on itself (GPU samples, say): memory is lost when watch
restarts, so anything a decision must not forget (when a host was first seen down, a retry's
backoff step) goes into the entries it returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dstack_plan.state.events import Event
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.model import HostSeen

if TYPE_CHECKING:
    from dstack_plan.project import Project


@dataclass(frozen=True)
class Tick:
    """One tick, as an actor sees it."""

    project: Project
    state: State
    """As refreshed from the agents this tick, with the changes of the actors before."""
    read: State
    """As read from the backend at the start of the tick (what the commit compares with)."""
    now: float
    """Epoch seconds, from the project's clock."""
    hosts: Sequence[HostSeen] = ()
    """Every machine of the fleets in state and of the fleets runs use, asked for its metrics
    this tick."""


@dataclass
class Acted:
    """What one actor did in a tick."""

    changed: dict[str, ResourceState] = field(default_factory=dict)
    """Entries to commit (by address), as the actor left them."""
    resubmitted: int = 0
    """Runs or replicas submitted again (`dstack_retries_total`)."""
    events: list[Event] = field(default_factory=list)
    """Events beyond the status changes the loop finds itself (a limit crossed, a host lost)."""


class Actor(Protocol):
    """One rule of the loop (see the module docstring)."""

    name: str
    """Short, for logs (`retry`, `limits`)."""

    async def act(self, tick: Tick) -> Acted:
        """Carry out the rule on `tick.state`; what changed. Errors about one run or host
        are logged and skipped inside; an exception fails only this actor's part of the tick."""
        ...


async def lock_holder(tick: Tick) -> str | None:
    """The operation (`apply`, `destroy`) holding the state's lock now, if any: actors that
    change what an apply may be changing too wait for it."""
    holder = await asyncio.to_thread(tick.project.backend.read_lock_info)
    if holder is None or holder.is_expired(tick.now):
        return None
    return holder.operation
