"""Cloud machines gone by themselves: a spot machine taken back, or one terminated outside
dstack-plan. Their jobs fail at once, for the retry policy to act on, instead of after the
unreachable grace period.

Each tick's refresh asks the provider for every cloud fleet's instances (`CloudFleetHandler.
refresh`); one that state records but the provider no longer lists is gone. It leaves the
fleet's record, and the unfinished jobs on it fail: a spot machine's with
`interrupted_by_no_capacity` (retry event `interruption`), an on-demand one's with
`instance_unreachable` (also an interruption). They are given up as an unreachable host's are
(`LOST_KEY`), so the retry policy, later in the same tick, takes them without asking an agent
that is gone. The next plan shows the fleet short of its node count and replaces the machine.
"""

from __future__ import annotations

import logging

from dstack_plan.fleets.cloud_records import CloudFleetRecord, CloudInstance, hosts_of
from dstack_plan.fleets.records import FleetRecord, is_cloud_fleet
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.events import host_event
from dstack_plan.watch.reachability import give_up_jobs
from dstack_plan.watch.retry_model import INSTANCE_UNREACHABLE, INTERRUPTED
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)


class Interruptions:
    """Fails the jobs of cloud machines that no longer exist (see the module doc)."""

    name = "interruptions"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        for entry in tick.state.resources.values():
            if entry.kind != "fleet" or entry.tainted or not is_cloud_fleet(entry):
                continue
            stored = tick.read.get(entry.address)
            if stored is None:
                continue
            alive = {i.id for i in CloudFleetRecord.of(entry).instances}
            gone = [i for i in CloudFleetRecord.of(stored).instances if i.id not in alive]
            if gone:
                self._drop(tick, stored, gone, acted)
        return acted

    def _drop(
        self, tick: Tick, entry: ResourceState, gone: list[CloudInstance], acted: Acted
    ) -> None:
        fleet = entry.address.split(".", 1)[1]
        reasons = {i.hostname: INTERRUPTED if i.spot else INSTANCE_UNREACHABLE for i in gone}
        ids = {i.id for i in gone}
        record = CloudFleetRecord.of(entry)
        kept = record.with_instances(i for i in record.instances if i.id not in ids)
        hosts = hosts_of(kept, FleetRecord.of(entry))
        attributes = {**entry.attributes, **hosts.to_attributes(), **kept.to_attributes()}
        acted.changed[entry.address] = entry.updated(now=entry.updated_at, attributes=attributes)
        for instance in gone:
            why = "spot machine taken back" if instance.spot else "terminated outside dstack-plan"
            reason = f"{reasons[instance.hostname]}: {instance.name} ({instance.id}) {why}"
            log.warning("%s: %s", entry.address, reason,
                        extra={"event": "instance_gone", "address": entry.address,
                               "host": instance.hostname, "resource_type": "fleet"})  # fmt: skip
            acted.events.append(
                host_event(
                    tick.now, entry, instance.status, "terminated", reason, instance.hostname
                )
            )
        give_up_jobs(tick, fleet, reasons, acted)
