"""Stopping what is left of a multi-node task that is over (`runs/gang.py` decides which)."""

from __future__ import annotations

import logging

from dstack_plan.agent.protocol import TERMINATED_BY_SERVER
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.runs.gang import gang_leftovers
from dstack_plan.runs.records import run_span_id
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)


class GangStops:
    """A node of a multi-node task failed (or its master is done, with `stop_criteria:
    master-done`): stop the others. Their new statuses are found by the next refresh."""

    name = "gang"

    async def act(self, tick: Tick) -> Acted:
        from dstack_plan.inspect.runs import job_jobs, job_records
        from dstack_plan.inspect.stop import stop_timeout

        for run in tick.state.resources.values():
            if run.kind != "task" or run.tainted:
                continue
            spec = spec_from_normalized(run.kind, run.spec)
            assert isinstance(spec, RunSpec)
            leftovers, why = gang_leftovers(spec, job_records(run))
            span = run_span_id(run)
            for job in leftovers:
                extra = {
                    "address": run.address,
                    "job_id": job.id,
                    "host": job.host,
                    "resource_type": "job",
                    "span_id": span,
                }
                log.info(
                    "%s: %s: stopping %s",
                    run.address,
                    why,
                    job.id,
                    extra={"event": "gang_stop", **extra},
                )
                try:
                    agent = await job_jobs(tick.project, run, job, tick.state)
                    timeout = stop_timeout(run)
                    await agent.stop(job.id, timeout=timeout, reason=TERMINATED_BY_SERVER)
                except DstackPlanError as e:
                    log.warning(
                        "%s: could not stop %s: %s",
                        run.address,
                        job.id,
                        e,
                        extra={"event": "stop_failed", **extra},
                    )
        return Acted()
