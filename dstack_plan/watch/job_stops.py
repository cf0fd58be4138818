"""Stopping one job an agent listed, for a rule of watch, and the event that says why.

The owner's rules (an importer over its daily GPU-hours, borrowed GPUs reclaimed) and a
project's priority preemption all stop a job as its host's agent lists it: gracefully, with
the `stop_timeout` its spec carries (its run's `stop_duration`), for a stop reason the agent
records. A stop that fails is logged and left to the next tick.
"""

from __future__ import annotations

import logging

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.cohort import job_label
from dstack_plan.runs.records import run_span_id
from dstack_plan.state.events import Event, span_id
from dstack_plan.state.model import State
from dstack_plan.watch.tick import Tick

log = logging.getLogger(__name__)


async def stop_listed(
    tick: Tick,
    fleet: str,
    host: str,
    info: JobInfo,
    reason: str,
    why: str,
    runs: State | None,
) -> Event | None:
    """Stop `info`'s job on `host` of `fleet` (as this project names the fleet) with the
    agent's stop `reason`; the event saying `why`, or None when the stop failed. `runs`: the
    state of the project whose run the job is, when read (its events then share a span)."""
    address = job_label(info, "address") or info.run_name
    timeout = info.spec.get("stop_timeout") if isinstance(info.spec, dict) else None
    try:
        agent = await tick.project.machines.jobs_api(fleet, host, tick.state)
        stopped = await agent.stop(info.id, timeout=float(timeout or 0.0), reason=reason)
    except DstackPlanError as e:
        log.warning("fleet.%s, %s: could not stop %s (%s): %s", fleet, host, info.id, address, e)
        return None
    log.info("fleet.%s, %s: stopping %s (%s): %s", fleet, host, info.id, address, why)
    entry = runs.get(address) if runs is not None else None
    return Event(
        time=tick.now,
        address=address,
        kind="job",
        span_id=run_span_id(entry) if entry is not None else span_id(address, info.submitted_at),
        old_status=info.status.value,
        new_status=stopped.status.value,
        job_id=info.id,
        reason=why,
        host=host,
    )
