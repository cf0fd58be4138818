"""The owner's watch gives each project its guaranteed share of an exported fleet back.

`.dstack/quotas.yml`'s `projects:` gives the owner and its importers a `guarantee` of the
fleets the owner exports (and a `borrowing_limit` beyond it). Idle GPUs may be borrowed; when a
project under its guarantee has a run waiting (`pending`) for the fleet, the owner's watch (the
lease holder of the owner's state) preempts borrowed jobs for it each tick: the newest first,
never taking another project below its guarantee, and only as many as the run needs on one
host (`runs/cohort.py`, `scheduler/fair_share.py`). A preempted job is stopped with the reason
`preempted` and its run's `stop_duration` as grace (SIGTERM, then kill); the run's own watch
sends it back to `pending`, restarting it when its `retry` covers `interruption`
(`watch/retries.py`). What each project under its guarantee waits for is published in the
owner's state (`policy.waiting`), and importers do not borrow those GPUs meanwhile
(`runs/share_gate.py`): a reclaimed job is not placed back where it would be reclaimed again.

The importers' states are read, never written (`sharing/importers.py`); the jobs on the hosts
are the agents' (all projects').
"""

from __future__ import annotations

import logging

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.protocol import PREEMPTED
from dstack_plan.config.quotas import load_quotas
from dstack_plan.runs.cohort import Cohort, Waiting, reclaims
from dstack_plan.runs.cohort_gather import gather_cohort, importer_states
from dstack_plan.scheduler.fair_share import Held
from dstack_plan.sharing.policy import with_waiting
from dstack_plan.state.commit import commit_async
from dstack_plan.state.events import Event
from dstack_plan.state.model import State
from dstack_plan.watch.job_stops import stop_listed
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)


class FairShare:
    """Reclaims borrowed GPUs of exported fleets, as an actor of the owner's loop."""

    name = "fair_share"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        quotas = load_quotas(tick.project.directory)
        guaranteed = any(q.guarantee is not None for q in quotas.projects.values())
        if not tick.state.exports or not guaranteed:
            await _publish(tick, {})  # nothing is reclaimed: nothing is waited for
            return acted
        owner = tick.project.name
        states = await importer_states(tick.project.imports, tick.state)
        waiting: dict[str, dict[str, float]] = {}
        for fleet in sorted({f for e in tick.state.exports.values() for f in e.fleets}):
            machines = tick.project.machines
            found = await gather_cohort(machines, owner, tick.state, fleet, quotas, states)
            if found is None:
                continue
            c, infos = found
            decided = reclaims(c)
            waiting[fleet] = decided.waiting
            for victim, run in decided.preempt:
                event = await _preempt(tick, fleet, victim, run, infos[victim.job], c, states)
                if event is not None:
                    acted.events.append(event)
        await _publish(tick, waiting)
        return acted


async def _preempt(
    tick: Tick,
    fleet: str,
    victim: Held,
    run: Waiting,
    info: JobInfo,
    c: Cohort,
    states: dict[str, State],
) -> Event | None:
    """Stop `victim` gracefully as `preempted`; the event that says for whom."""
    guarantee = next((t.guarantee_gpus for t in c.tenants if t.name == run.tenant), 0.0)
    why = (
        f"preempted: project {run.tenant} is under its guarantee of {guarantee:g} GPUs on "
        f"fleet {fleet} and its {run.address} waits; {victim.tenant} borrowed them"
    )
    runs = tick.state if victim.tenant == tick.project.name else states.get(victim.tenant)
    return await stop_listed(tick, fleet, victim.host, info, PREEMPTED, why, runs)


async def _publish(tick: Tick, waiting: dict[str, dict[str, float]]) -> None:
    """Record in the owner's state what projects under their guarantee wait for (a commit of
    its own: the policy is not a resource); nothing when it is as published."""
    if with_waiting(tick.state.policy, waiting) == tick.state.policy:
        return
    await commit_async(
        tick.project.backend,
        lambda s: s.model_copy(update={"policy": with_waiting(s.policy, waiting)}),
    )
