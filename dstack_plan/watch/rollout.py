"""Finishing a service's rolling update that `apply` left midway (`runs/rollout.py`).

A service whose replicas do not all run its spec (an apply killed during a rolling update)
is moved on by one step per tick: a new replica started, or, once it runs, the old one
stopped (`terminated_by_server`), so it never has fewer replicas running than it should.
Nothing is done while an `apply` or `destroy` holds the state's lock: that apply may be
rolling the service itself.
"""

from __future__ import annotations

import logging

from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.handler import RunHandler
from dstack_plan.runs.records import run_span_id
from dstack_plan.runs.rollout import in_progress, step
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.superseded import Superseded, log_superseded, still_current
from dstack_plan.watch.tick import Acted, Tick, lock_holder

log = logging.getLogger(__name__)


class Rollout:
    """Rolling updates left unfinished, as an actor of the loop."""

    name = "rollout"

    async def act(self, tick: Tick) -> Acted:
        runs = [r for r in tick.state.resources.values() if in_progress(r)]
        if not runs:
            return Acted()
        holder = await lock_holder(tick)
        if holder is not None:
            log.info("state locked by %s: rollouts wait", holder)
            return Acted()
        handler = tick.project.handlers()["service"]
        assert isinstance(handler, RunHandler)
        ctx = tick.project.context(tick.state)
        changed: dict[str, ResourceState] = {}
        for run in runs:
            try:
                await still_current(tick.project, tick.read, run.address)  # a destroy since wins
                result = await step(handler, run, ctx)
            except Superseded as e:
                log_superseded(e)
                continue
            except DstackPlanError as e:
                log.warning("%s: rollout step failed: %s", run.address, e)
                continue
            if result.message:
                log.info(
                    "%s: %s",
                    run.address,
                    result.message,
                    extra={
                        "event": f"rollout_{result.kind}",
                        "address": run.address,
                        "resource_type": "run",
                        "span_id": run_span_id(run),
                    },
                )
            if result.entry != run:
                changed[run.address] = result.entry
        return Acted(changed=changed)
