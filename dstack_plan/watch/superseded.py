"""Whether watch may still start jobs for a run, asked of the state as it is stored now.

A tick decides from the state it read at its start, then spends seconds asking agents; a
`dstack destroy` (or an apply) may meanwhile delete the run or its fleet: it holds the
operation lock, watch does not. So just before watch starts anything on hosts (a run or some
of its replicas started again, a queued or scheduled run placed, replicas added or rolled),
it reads the lock and the state again (`still_current`: two small reads, only when it is about to
act) and leaves the run to the next tick (`Superseded`) when:

- an operation holds the lock: destroy stops a run's jobs first and removes its entry after
  (`apply/operations.py`), so while it works the serial does not tell yet;
- the serial moved since the tick's read, and the run's entry or its fleet's is gone,
  tainted or changed since: its jobs would go to hosts the fleet no longer claims, or the
  tick's commit of the entry would be dropped (`record.py`: apply's newer word wins), leaving
  jobs that nothing records.

The next tick reads the state anew and decides from what is. Agents are the other half:
watch never starts one (`FleetMachines.start_agents` is off while it runs, `loop.py`), so a
host whose fleet is gone simply does not answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.records import RunRecord
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.project import Project

log = logging.getLogger(__name__)


class Superseded(DstackPlanError):
    """The run is left alone this tick: the state moved on (or is being changed) since the
    tick read it."""

    def __init__(self, address: str, why: str):
        self.address = address
        self.why = why
        super().__init__(f"{address}: left for the next tick: {why}")


async def still_current(project: Project, read: State, address: str) -> None:
    """Raise `Superseded` when watch must not start jobs for run `address` now (see the
    module doc); `read` is the state as the tick read it."""
    holder = await asyncio.to_thread(project.backend.read_lock_info)
    if holder is not None and not holder.is_expired(project.clock.now()):
        raise Superseded(address, f"{holder.operation} holds the state lock")
    fresh = (await asyncio.to_thread(project.backend.read)).state
    why = moved_on(read, fresh, address)
    if why is not None:
        raise Superseded(address, why)


def moved_on(read: State, fresh: State, address: str) -> str | None:
    """Why run `address`, as `read` has it, may no longer be acted on now that the state is
    `fresh`; None when it may (pure)."""
    if fresh.serial == read.serial:
        return None
    then, now = read.get(address), fresh.get(address)
    if now is None:
        return "it is gone from state"
    why = _changed(then, now)
    if why is not None:
        return f"it {why}"
    fleet = f"fleet.{RunRecord.of(now).fleet}"
    if read.get(fleet) is None:
        return None  # a fleet no resource creates (the local machine): nothing to lose
    if fresh.get(fleet) is None:
        return f"{fleet} is gone from state"
    why = _changed(read.get(fleet), fresh.get(fleet))
    return None if why is None else f"{fleet} {why}"


def _changed(then: ResourceState | None, now: ResourceState | None) -> str | None:
    assert now is not None
    if now.tainted:
        return "is being replaced"
    if then is None or then.updated_at != now.updated_at:
        return "changed since the tick read the state"
    return None


def log_superseded(e: Superseded) -> None:
    log.info(
        "%s",
        e,
        extra={"event": "run_superseded", "address": e.address, "resource_type": "run"},
    )
