"""Request-rate autoscaling: services with `scaling` get the replicas their traffic through
watch's proxy asks for (`scaling_decision.py`), within their `replicas` range.

Each tick, for every such service, the proxy's request counts give a rate over
`scaling.window`; the decision is carried out by the service's handler (`RunHandler.scale`:
new replicas placed and started, the surplus stopped as `scaled_down`), and kept in the
run's state attributes (`runs/scaling.py`), which `ps` shows and a later `apply` keeps.
Nothing is done while an `apply` or `destroy` holds the state's lock, nor to a service in
a rolling update. Only a watch that serves services (`--proxy-port`) scales: it is the one
that sees the requests.
"""

from __future__ import annotations

import logging

from dstack_plan.config.runs import ServiceSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.proxy.stats import RequestStats
from dstack_plan.runs.handler import RunHandler
from dstack_plan.runs.records import RunRecord, run_span_id
from dstack_plan.runs.rollout import in_progress
from dstack_plan.runs.scaling import (
    SCALING_KEY,
    ScalingRecord,
    autoscaled,
    kept_replicas,
    replica_range,
)
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.scaling_decision import Load, decide
from dstack_plan.watch.superseded import Superseded, log_superseded, still_current
from dstack_plan.watch.tick import Acted, Tick, lock_holder

log = logging.getLogger(__name__)


class Autoscaler:
    """Scales services by request rate, as an actor of the loop (see the module doc)."""

    name = "autoscale"

    def __init__(self, stats: RequestStats, counting_since: float) -> None:
        self._stats = stats
        self._since = counting_since
        """When the proxy began counting (epoch seconds, the project's clock)."""

    async def act(self, tick: Tick) -> Acted:
        services = [e for e in tick.state.resources.values() if _scaled(e)]
        if not services:
            return Acted()
        holder = await lock_holder(tick)
        if holder is not None:
            log.info("state locked by %s: autoscaling waits", holder)
            return Acted()
        handler = tick.project.handlers()["service"]
        assert isinstance(handler, RunHandler)
        changed: dict[str, ResourceState] = {}
        for entry in services:
            try:
                updated = await self._scale(tick, handler, entry)
            except Superseded as e:
                log_superseded(e)
                continue
            except DstackPlanError as e:
                log.warning("%s: scaling failed: %s", entry.address, e)
                continue
            if updated != entry:
                changed[entry.address] = updated
        return Acted(changed=changed)

    async def _scale(self, tick: Tick, handler: RunHandler, entry: ResourceState) -> ResourceState:
        spec = spec_from_normalized("service", dict(entry.spec))
        assert isinstance(spec, ServiceSpec) and spec.scaling is not None
        record = ScalingRecord.of(entry.attributes)
        current = kept_replicas(spec, entry.attributes)
        scaled_at = record.scaled_at if record else entry.created_at.timestamp()
        load = Load(
            rps=self._stats.rps(entry.name, spec.scaling.window),
            in_flight=self._stats.in_flight(entry.name),
            observed_for=tick.now - self._since,
        )
        decision = decide(spec.scaling, replica_range(spec), current, load, scaled_at, tick.now)
        replicas = len({job.replica for job in RunRecord.of(entry).jobs})
        status, attributes = entry.status, dict(entry.attributes)
        if decision.desired != replicas:
            await still_current(tick.project, tick.read, entry.address)  # a destroy since wins
            outcome = await handler.scale(
                entry, decision.desired, tick.project.context(tick.state)
            )
            status, attributes = outcome.status, dict(outcome.attributes)
            log.info(
                "%s: scaled from %d to %d replicas (%.3g req/s, target %g per replica)",
                entry.address,
                replicas,
                decision.desired,
                load.rps,
                spec.scaling.target,
                extra={
                    "event": "service_scaled",
                    "address": entry.address,
                    "resource_type": "run",
                    "span_id": run_span_id(entry),
                },
            )
        if record is None or (record.desired, record.wanted) != (
            decision.desired,
            decision.wanted,
        ):
            attributes[SCALING_KEY] = ScalingRecord(
                desired=decision.desired,
                wanted=decision.wanted,
                rps=round(load.rps, 3),
                scaled_at=tick.now if decision.desired != current else scaled_at,
                held_by=decision.held_by,
                held_until=decision.held_until,
            ).model_dump(mode="json")
        return entry.updated(now=entry.updated_at, status=status, attributes=attributes)


def _scaled(entry: ResourceState) -> bool:
    if entry.kind != "service" or entry.tainted or entry.status in FINISHED_STATUSES:
        return False
    if in_progress(entry):
        return False  # the rollout moves it on first
    spec = spec_from_normalized("service", dict(entry.spec))
    return isinstance(spec, ServiceSpec) and autoscaled(spec)
