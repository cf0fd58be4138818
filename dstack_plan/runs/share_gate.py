"""Fair share at the door of a shared fleet: may this project borrow now?

The owner's `.dstack/quotas.yml` gives this project (an importer, or the owner itself) a
`guarantee` of the owner's exported fleets and a `borrowing_limit` beyond it (published in
the owner's state: `sharing/policy.py`). A run within the guarantee is placed as any other.
One that borrows (takes this project's GPUs on the fleet beyond its guarantee) is held back
while it would go over the borrowing limit, and while another project under its guarantee
waits for GPUs on that fleet (the owner's watch publishes who waits: `watch/fair_share.py`):
what it borrowed would be reclaimed at once, so a preempted job is not placed back where it
would be preempted again. Held back, the run waits as for a full fleet (`NoCapacity`: queued
when its `retry` covers no-capacity).
"""

from __future__ import annotations

from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.fleets.records import FleetRecord
from dstack_plan.runs.cohort import tenant_of
from dstack_plan.runs.queueing import NoCapacity
from dstack_plan.runs.records import RunRecord
from dstack_plan.runs.usage import run_usage
from dstack_plan.scheduler.fair_share import Held, admit
from dstack_plan.sharing.imports import SEPARATOR, Imports, is_imported
from dstack_plan.sharing.policy import PROJECTS_KEY, limits_for, waiting_on
from dstack_plan.state.model import ResourceState, State


class ShareHold(NoCapacity):
    """The run would borrow GPUs the fair share of the owner's fleet does not lend now."""


def check_share(
    imports: Imports, fleet: str, address: str, gpus: float, state: State, now: float
) -> None:
    """Raise ShareHold when starting `address` (`gpus` GPUs in all) on `fleet` would borrow
    what the owner's fair share does not lend now (see the module docstring): an imported
    fleet, or one this project exports (the owner is one of its fleet's projects too).
    Nothing to check on a fleet nobody shares, or without a published guarantee."""
    if gpus <= 0:
        return
    if is_imported(fleet):
        owner, _, name = fleet.partition(SEPARATOR)
        owner_state = imports.state_of(owner)
        entry: ResourceState | None = imports.fleet(fleet, placing=False)
    else:
        if not any(fleet in e.fleets for e in state.exports.values()):
            return
        owner, name, owner_state = imports.project, fleet, state
        entry = state.get(f"fleet.{fleet}")
    mine = limits_for(owner, owner_state, imports.project)
    if mine is None or mine.guarantee is None or entry is None:
        return
    capacity = float(
        sum(len(h.resources.gpus) for h in FleetRecord.of(entry).hosts if h.resources)
    )
    tenants = [
        tenant_of(p, limits_for(owner, owner_state, p), capacity) for p in _projects(owner_state)
    ]
    holding = sum(
        run_usage(r, now).gpus
        for r in state.resources.values()
        if r.kind in RUN_KINDS and r.address != address and RunRecord.of(r).fleet == fleet
    )
    held = [Held("", imports.project, "", holding, 0.0)]
    waiting = waiting_on(owner_state, name)
    # what other projects hold is the owner's to know: only this project's share is judged
    decision = admit(imports.project, gpus, tenants, held, float("inf"), waiting)
    if not decision.ok:
        raise ShareHold(
            fleet, f"fair share of fleet {name} of project {owner}: {decision.why}", address
        )


def _projects(state: State) -> list[str]:
    projects = state.policy.get(PROJECTS_KEY)
    return sorted(projects) if isinstance(projects, dict) else []
