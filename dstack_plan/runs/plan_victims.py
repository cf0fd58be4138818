"""Which jobs a run the plan finds waiting would take back by preemption.

On a fleet this project exports with fair-share guarantees (`.dstack/quotas.yml`
`projects:`), a run of this project that waits while the project is under its guarantee gets
GPUs back from the projects that borrowed them: the owner's watch preempts their newest jobs
(`watch/fair_share.py`). The plan names those jobs (`Placement.preempts`), chosen by the same
rule (`scheduler/fair_share.reclaim`) from what the agents list now.
"""

from __future__ import annotations

from collections.abc import Mapping

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.quotas import load_quotas
from dstack_plan.config.runs import RunSpec
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.plan.model import Placement
from dstack_plan.runs.cohort import job_label, job_shape
from dstack_plan.runs.cohort_gather import gather_cohort, importer_states
from dstack_plan.runs.usage import slot_gpus
from dstack_plan.scheduler.fair_share import reclaim
from dstack_plan.sharing.imports import is_imported
from dstack_plan.state.model import State


async def with_victims(
    machines: FleetMachines,
    state: State,
    fleet: str,
    placements: Mapping[str, Placement],
    specs: Mapping[str, RunSpec],
) -> dict[str, Placement]:
    """`placements` with, on each pending one, the jobs its preemption would stop."""
    result = dict(placements)
    waiting = [a for a, p in placements.items() if p.pending and not p.placed and a in specs]
    imports = machines.imports
    exported = any(fleet in e.fleets for e in state.exports.values())
    if not waiting or imports is None or is_imported(fleet) or not exported:
        return result
    quotas = load_quotas(imports.project_dir)
    if not any(q.guarantee is not None for q in quotas.projects.values()):
        return result
    owner = imports.project
    importers = await importer_states(imports, state)
    found = await gather_cohort(machines, owner, state, fleet, quotas, importers)
    if found is None:
        return result
    c, infos = found
    for address in waiting:
        largest = max(slot_gpus(specs[address]).values(), default=0.0)
        if largest <= 0:
            continue
        victims = reclaim(owner, job_shape(largest), c.tenants, c.held, c.free)
        if victims:
            named = tuple(f"{v.tenant}: {_address(infos, v.job)} ({v.job})" for v in victims)
            placement = result[address]
            note = f"{placement.note}; would preempt {', '.join(named)} (under its guarantee)"
            result[address] = placement.model_copy(update={"preempts": named, "note": note})
    return result


def _address(infos: Mapping[str, JobInfo], job: str) -> str:
    """The run address a listed job carries, else its id."""
    info = infos.get(job)
    return (job_label(info, "address") if info is not None else None) or job
