"""Releasing idle cloud machines: a machine of a cloud fleet that no job has used for its idle
duration is terminated, as long as the fleet stays at `nodes.min` or above (reference §3.6).

Idle means no job of the state's runs is unfinished on it. Watch records on the machine when it
first saw it idle (`idle_since`, so a restarted watch carries on) and clears it when a job runs
there again. The fleet never goes below `nodes.min`: a fixed-size fleet
(`nodes: 2`) is never shrunk, so it cannot be terminated and recreated in a loop (dstack
#3128). The machines idle longest go first. SSH hosts are never released.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.cloud_records import CloudFleetRecord, CloudInstance
from dstack_plan.fleets.idle import IdleDuration, idle_limit
from dstack_plan.fleets.records import FleetRecord, is_cloud_fleet
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.runs.records import RunRecord
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch.events import host_event
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)


def releasable(
    instances: Sequence[CloudInstance],
    busy: Collection[str],
    now: float,
    floor: int,
    fleet_idle: IdleDuration,
) -> tuple[list[CloudInstance], list[CloudInstance]]:
    """(the instances with `idle_since` brought up to date, those to release now). `busy`:
    the hostnames a job runs on. Never more are released than leave `floor` machines."""
    seen: list[CloudInstance] = []
    due: list[tuple[float, CloudInstance]] = []
    for instance in instances:
        if instance.hostname in busy or not instance.hostname:
            seen.append(instance.model_copy(update={"idle_since": None}))
            continue
        since = instance.idle_since if instance.idle_since is not None else now
        instance = instance.model_copy(update={"idle_since": since})
        seen.append(instance)
        limit = idle_limit(instance.idle_duration, fleet_idle)
        if limit != "off" and now - since >= limit:
            due.append((since, instance))
    room = max(len(instances) - floor, 0)
    chosen = [i for _, i in sorted(due, key=lambda d: d[0])][:room]
    return seen, chosen


class IdleMachines:
    """Terminates cloud machines idle past their idle duration (see the module doc)."""

    name = "idle"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        busy = _busy_hosts(tick.state)
        for entry in tick.state.resources.values():
            if entry.kind != "fleet" or entry.tainted or not is_cloud_fleet(entry):
                continue
            try:
                changed = await self._fleet(tick, entry, busy.get(entry.address, set()), acted)
            except DstackPlanError as e:
                log.warning("%s: cannot release idle machines: %s", entry.address, e)
                continue
            if changed is not None:
                acted.changed[entry.address] = changed
        return acted

    async def _fleet(
        self, tick: Tick, entry: ResourceState, busy: set[str], acted: Acted
    ) -> ResourceState | None:
        from dstack_plan.config.fleet import FleetSpec  # only projects with fleets load it
        from dstack_plan.plan.normalize import spec_from_normalized

        spec = spec_from_normalized("fleet", dict(entry.spec))
        assert isinstance(spec, FleetSpec)
        record = CloudFleetRecord.of(entry)
        floor = spec.nodes.min if spec.nodes is not None else 0
        seen, due = releasable(record.instances, busy, tick.now, floor, spec.idle_duration)
        fleet = entry.address.split(".", 1)[1]
        released: set[str] = set()
        for instance in due:
            provider = tick.project.clouds.provider(
                instance.provider, tick.state.lineage, creating=False
            )
            try:
                await provider.terminate([instance.as_instance(fleet)])
            except DstackPlanError as e:
                log.warning("%s: cannot release %s: %s", entry.address, instance.id, e)
                continue
            released.add(instance.id)
            idle_s = tick.now - (instance.idle_since or tick.now)
            reason = f"idle_timeout: {instance.name} ({instance.id}) idle for {idle_s:.0f}s"
            log.info("%s: released %s", entry.address, reason,
                     extra={"event": "instance_released", "address": entry.address,
                            "host": instance.hostname, "resource_type": "fleet"})  # fmt: skip
            acted.events.append(
                host_event(tick.now, entry, "idle", "terminated", reason, instance.hostname)
            )
        kept = record.with_instances(i for i in seen if i.id not in released)
        if kept == record:
            return None
        names = {i.hostname for i in kept.instances}
        hosts = FleetRecord.of(entry)
        hosts = hosts.model_copy(
            update={"hosts": tuple(h for h in hosts.hosts if h.name in names)}
        )
        attributes = {**entry.attributes, **hosts.to_attributes(), **kept.to_attributes()}
        return entry.updated(now=entry.updated_at, attributes=attributes)


def _busy_hosts(state: State) -> dict[str, set[str]]:
    """Fleet address -> the hosts an unfinished job of the state's runs is on."""
    busy: dict[str, set[str]] = {}
    for entry in state.resources.values():
        if entry.kind not in RUN_KINDS:
            continue
        record = RunRecord.of(entry)
        hosts = {j.host for j in record.jobs if j.status not in FINISHED_STATUSES}
        if hosts:
            busy.setdefault(f"fleet.{record.fleet}", set()).update(hosts)
    return busy
