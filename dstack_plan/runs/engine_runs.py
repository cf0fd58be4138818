"""Runs on engine fleets (Slurm, Kubernetes): the plan's placement and the apply's submission,
each handed to its engine's module.

Where runs on other fleets are placed on machines by our scheduler and handed to our agent on
each, a run on an engine fleet is one submission to the cluster, whose own scheduler decides
when and where it starts (`runs/slurm_runs.py`, `runs/kubernetes_runs.py`). Its jobs are
recorded like any run's, their host being the cluster's name, so refresh, watch, `ps`, `logs`
and `stop` reach them through the fleet's `JobsAPI` (`FleetMachines.jobs_api`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.plan.model import Placement
from dstack_plan.runs.jobs import JobContext, JobSlot
from dstack_plan.runs.submission import Submitted
from dstack_plan.state.model import State


def _module(machines: FleetMachines, fleet: str, state: State) -> ModuleType:
    """The runs module of engine fleet `fleet`'s backend (imported only when used)."""
    entry = machines.recorded(fleet, state)
    provider = entry.provider if entry is not None else "?"
    if provider == "slurm":
        from dstack_plan.runs import slurm_runs

        return slurm_runs
    if provider == "kubernetes":
        from dstack_plan.runs import kubernetes_runs

        return kubernetes_runs
    raise ProviderError("fleet", f"fleet {fleet!r} ({provider}) is not an engine fleet")


async def plan_placement(
    machines: FleetMachines, fleet: str, spec: RunSpec, state: State, now: float
) -> Placement:
    """Where a run would go on engine fleet `fleet`; placed False with the reason when the
    cluster can never take it."""
    placement: Placement = await _module(machines, fleet, state).plan_placement(
        machines, fleet, spec, state, now
    )
    return placement


async def submit_run(
    machines: FleetMachines,
    fleet: str,
    state: State,
    spec: RunSpec,
    context: JobContext,
    secrets: SecretStore,
    ctx: ApplyContext,
    address: str,
    only: Sequence[JobSlot] | None = None,
) -> list[Submitted]:
    """Submit `spec`'s jobs (`only` those slots when given) to engine fleet `fleet`'s
    cluster; what was submitted, per slot."""
    submitted: list[Submitted] = await _module(machines, fleet, state).submit_run(
        machines, fleet, state, spec, context, secrets, ctx, address, only
    )
    return submitted
