"""Cloud fleets made real: machines created from offers, booted, then joined as SSH hosts.

create and update converge the fleet on `nodes.target` (else `nodes.min`) machines:
- too few: the offers the fleet allows are tried in order (`fleets/offers.py`, at most 25,
  falling through on no capacity or quota), the new instances' ids committed to state at once
  (so a crash or a failed boot never loses one), then each is waited for (running, an
  address, port 22 open) and given the agent over SSH exactly as an SSH fleet's host is
  (`FleetHandler.provision`, the project key, the host key pinned on first use);
- too many: the newest machines leave, drained first as an SSH host leaving its fleet is
  (refused while jobs run there, unless `apply --force`), and are terminated;
- every machine created but not yet a host (its boot or install failed before) is joined.
Refresh asks the provider which instances still exist (one gone by itself, such as a spot
machine taken back, leaves the record) and the agents what the hosts are like. Delete
terminates every instance state records or the provider's tags name for the fleet, and waits
until they are gone; an interrupted destroy finds them again by tag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dstack_plan.apply.events import plural
from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.cloud_records import (
    CloudFleetRecord,
    CloudInstance,
    cloud_ssh_config,
    hosts_of,
)
from dstack_plan.fleets.idle import burst_idle
from dstack_plan.fleets.offers import ranked_offers, target_nodes
from dstack_plan.fleets.records import FleetRecord, is_cloud_fleet
from dstack_plan.plan.model import Action, MachineOffer, Placement, ResourceChange
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.base import Instance, Offer, Provider
from dstack_plan.providers.capabilities import ProviderWithTags
from dstack_plan.providers.capacity import create_first
from dstack_plan.providers.project_key import project_key
from dstack_plan.providers.ssh.pins import MemoryHostKeyStore
from dstack_plan.scheduler.offer_choice import MAX_TRIES
from dstack_plan.state import timestamp
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.config.fleet import FleetSpec
    from dstack_plan.config.resources import ResourcesSpec
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.fleets.ssh import FleetHandler
    from dstack_plan.providers.configured import ConfiguredClouds

log = logging.getLogger(__name__)

BOOT_TIMEOUT = 900.0
"""Seconds a new machine gets to be running with SSH open (GPU images boot slowly)."""
TERMINATE_TIMEOUT = 600.0
"""Seconds destroy waits for terminated machines to be gone before reporting them."""
POLL_SECONDS = 3.0


class CloudFleetHandler(ResourceHandler):
    """Fleets with `nodes`, on the backends `.dstack/backends.yml` configures."""

    def __init__(
        self,
        hosts: FleetHandler,
        clouds: ConfiguredClouds,
        *,
        boot_timeout: float = BOOT_TIMEOUT,
        terminate_timeout: float = TERMINATE_TIMEOUT,
        poll_seconds: float = POLL_SECONDS,
    ):
        self._hosts = hosts
        """Joins booted machines as hosts (agent install, facts, drain), as for SSH fleets."""
        self._clouds = clouds
        self._boot_timeout = boot_timeout
        self._terminate_timeout = terminate_timeout
        self._poll = poll_seconds
        self._growing: dict[str, asyncio.Lock] = {}
        """One burst at a time per fleet: two runs growing it at once would number their
        machines alike."""

    def cannot_create(self, kind: str, provider: str) -> str | None:
        return self._clouds.cannot_create(provider)

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        assert change.after is not None
        spec = _fleet(change.after)
        record = CloudFleetRecord(identity_file=str(project_key(ctx.project_dir).private_path))
        return await self._converge(change, spec, record, FleetRecord(), ctx)

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        assert change.after is not None
        spec = _fleet(change.after)
        return await self._converge(
            change, spec, CloudFleetRecord.of(current), FleetRecord.of(current), ctx
        )

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        record = CloudFleetRecord.of(current)
        lineage = ctx.current_state().lineage
        try:
            seen = await self._refreshed(current.address, record.instances, lineage)
        except ProviderError as e:
            # the cloud cannot be asked now (no network, credentials gone, backend removed):
            # trust the state, as for a host that does not answer; delete says what it needs
            log.warning("%s: cannot ask %s about its machines: %s", current.address,
                        current.provider, e)  # fmt: skip
            return Refreshed(status=current.status, attributes=dict(current.attributes))
        gone = [i.id for i in record.instances if i.id not in seen]
        record = _alive(record, seen)
        hosts = hosts_of(record, FleetRecord.of(current))
        updated = current.updated(now=current.updated_at, attributes=_attributes(record, hosts))
        if cloud_ssh_config(record).hosts:
            name = current.address.split(".", 1)[1]
            hosts = await self._hosts.refresh_hosts(name, cloud_ssh_config(record), updated)
        target = target_nodes(_fleet(current.spec), len(record.instances))
        short = None
        if len(record.instances) < target:
            # a spot machine taken back, or one terminated outside dstack-plan
            short = f"{len(record.instances)} of {plural(target, 'machine')} left"
            if gone:
                short += f" ({', '.join(gone)} gone)"
        return Refreshed(
            status=_status(record, hosts, target),
            attributes=_attributes(record, hosts),
            short=short,
        )

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        name = current.address.split(".", 1)[1]
        record = CloudFleetRecord.of(current)
        keep = {i.id for i in CloudFleetRecord.of(ctx.replacement).instances}
        lineage = ctx.current_state().lineage
        targets = {i.id: i.as_instance(name) for i in record.instances}
        if not self._clouds.backend_types(current.provider):
            if targets:
                raise ProviderError(
                    current.provider,
                    f"cannot terminate {plural(len(targets), 'machine')}: the backend is no "
                    "longer configured in .dstack/backends.yml",
                    current.address,
                )
            return  # nothing was created: nothing to find
        for provider in self._providers(current.provider, lineage):
            for instance in await _tagged(provider, name):
                targets.setdefault(instance.id, instance)
        doomed = [i for i in targets.values() if i.id not in keep]
        if doomed:
            ctx.progress(current.address, f"terminating {plural(len(doomed), 'machine')}")
            await self._terminate(current.address, doomed, lineage)

    # -- converging

    async def grow(
        self, fleet: str, planned: MachineOffer, run: RunSpec, ctx: ApplyContext
    ) -> State:
        """Add `planned.count` machines to cloud fleet `fleet` for a run bursting to it
        (`runs/bursting.py`), the planned offer first, then any other that the fleet and
        the run's resources allow; commit the fleet's entry and return the state written."""
        address = f"fleet.{fleet}"
        async with self._growing.setdefault(address, asyncio.Lock()):
            entry = ctx.current_state().get(address)
            if entry is None or not is_cloud_fleet(entry):
                raise ProviderError("fleet", f"{address} is not a cloud fleet in state", address)
            change = ResourceChange(
                address=address,
                kind="fleet",
                name=fleet,
                provider=entry.provider,
                action=Action.UPDATE,
                after=dict(entry.spec),
                placement=Placement(fleet=fleet, provider=entry.provider, offer=planned),
            )
            outcome = await self._converge(
                change,
                _fleet(entry.spec),
                CloudFleetRecord.of(entry),
                FleetRecord.of(entry),
                ctx,
                add=planned.count,
                burst=run,
            )
            return await _commit_grown(ctx, entry, outcome)

    async def _converge(
        self,
        change: ResourceChange,
        spec: FleetSpec,
        record: CloudFleetRecord,
        hosts: FleetRecord,
        ctx: ApplyContext,
        *,
        add: int | None = None,
        burst: RunSpec | None = None,
    ) -> Outcome:
        """Make the fleet have its target machines (or `add` more than it has, for the run
        `burst`), every one of them a host."""
        address, name = change.address, change.address.split(".", 1)[1]
        lineage = ctx.current_state().lineage
        if record.instances:  # those gone since (a spot machine taken back) are replaced
            record = _alive(record, await self._refreshed(address, record.instances, lineage))
            hosts = hosts_of(record, hosts)
        have = len(record.instances)
        target = have + add if add is not None else target_nodes(spec, have)
        extra = have - target
        if extra > 0:
            record, hosts = await self._shrink(address, record, hosts, extra, ctx, lineage)
        elif extra < 0:
            wanted = burst.resources if burst is not None else None
            offers = await self._offers(change, spec, lineage, wanted)
            providers = {p.name: p for p in self._providers(change.provider, lineage)}
            ctx.progress(address, f"creating {plural(-extra, 'machine')}")
            created = await create_first(
                lambda n: providers[n], name, offers, -extra, limit=MAX_TRIES
            )
            for refusal in created.refused:
                ctx.progress(address, f"no capacity: {refusal}")
            user = self._clouds.ssh_user(created.offer.provider)
            new = [CloudInstance.created(i, created.offer, user) for i in created.instances]
            if burst is not None:  # released when idle by the shorter of the two durations
                idle = burst_idle(spec.idle_duration, burst.idle_duration)
                new = [i.model_copy(update={"idle_duration": idle}) for i in new]
            record = record.with_instances([*record.instances, *new])
            await _save(ctx, address, _attributes(record, hosts))
        joined = {h.name for h in hosts.hosts}
        waiting = [i for i in record.instances if i.hostname not in joined or not i.hostname]
        if waiting:
            booted = await self._boot(address, name, waiting, lineage, ctx)
            record = record.with_instances(booted.get(i.id, i) for i in record.instances)
            await _save(ctx, address, _attributes(record, hosts))
            hosts = await self._hosts.provision(
                name, cloud_ssh_config(record), hosts, address, ctx
            )
        return Outcome(_status(record, hosts, target), _attributes(record, hosts))

    async def _offers(
        self, change: ResourceChange, spec: FleetSpec, lineage: str, run: ResourcesSpec | None
    ) -> list[Offer]:
        providers = self._providers(change.provider, lineage)
        planned = change.placement.offer if change.placement is not None else None
        zones = planned.zones if planned is not None else None  # as planned: a volume's zone
        ranking = await ranked_offers(spec, providers, run, zones)
        offers = list(ranking.ranked)
        if planned is not None:  # what the plan showed goes first, if still offered
            first = [
                o
                for o in offers
                if (o.provider, o.instance_type, o.region, o.spot)
                == (planned.provider, planned.instance_type, planned.region, planned.spot)
            ]
            offers = first[:1] + [o for o in offers if o not in first[:1]]
        if not offers:
            raise ProviderError(change.provider, ranking.why_none(), change.address)
        return offers

    async def _shrink(
        self,
        address: str,
        record: CloudFleetRecord,
        hosts: FleetRecord,
        count: int,
        ctx: ApplyContext,
        lineage: str,
    ) -> tuple[CloudFleetRecord, FleetRecord]:
        """Drain and terminate the `count` newest machines."""
        name = address.split(".", 1)[1]
        leaving = list(record.instances[-count:])
        gone = cloud_ssh_config(record.with_instances(leaving))
        if gone.hosts:
            await self._hosts.drain(name, gone, MemoryHostKeyStore(hosts.pins()), address, ctx)
        ctx.progress(address, f"terminating {plural(len(leaving), 'machine')}")
        await self._terminate(address, [i.as_instance(name) for i in leaving], lineage)
        record = record.with_instances(record.instances[:-count])
        return record, hosts_of(record, hosts)

    async def _boot(
        self,
        address: str,
        name: str,
        waiting: Sequence[CloudInstance],
        lineage: str,
        ctx: ApplyContext,
    ) -> dict[str, CloudInstance]:
        """The machines of `waiting` once each runs with an address and its SSH port open;
        ProviderError naming those that did not within the boot timeout."""
        ctx.progress(address, f"waiting for {plural(len(waiting), 'machine')} to boot")
        deadline = time.monotonic() + self._boot_timeout
        pending = {i.id: i for i in waiting}
        ready: dict[str, CloudInstance] = {}
        while True:
            seen = await self._refreshed(address, list(pending.values()), lineage)
            for iid in list(pending):
                now = seen.get(iid)
                if now is None:
                    raise ProviderError(
                        pending[iid].provider,
                        f"machine {iid} disappeared while booting",
                        address,
                    )
                instance = pending[iid].seen(now)
                pending[iid] = instance
                if instance.status in ("idle", "busy") and instance.hostname:
                    if await _ssh_open(instance.hostname):
                        ready[iid] = pending.pop(iid)
            if not pending:
                return ready
            if time.monotonic() >= deadline:
                late = ", ".join(f"{i.id} ({i.status})" for i in pending.values())
                raise ProviderError(
                    next(iter(pending.values())).provider,
                    f"machine(s) not reachable over SSH within {self._boot_timeout:g}s: {late}",
                    address,
                )
            await asyncio.sleep(self._poll)

    async def _terminate(self, address: str, doomed: Sequence[Instance], lineage: str) -> None:
        """Terminate `doomed` and wait until the provider no longer lists them."""
        by_provider: dict[str, list[Instance]] = {}
        for instance in doomed:
            by_provider.setdefault(instance.provider, []).append(instance)
        deadline = time.monotonic() + self._terminate_timeout
        for name, instances in by_provider.items():
            provider = self._clouds.provider(name, lineage, creating=False)
            await provider.terminate(instances)
            while left := await provider.refresh(instances):
                if time.monotonic() >= deadline:
                    ids = ", ".join(f"{i.id} ({i.status})" for i in left)
                    raise ProviderError(name, f"still terminating: {ids}", address)
                await asyncio.sleep(self._poll)
                await provider.terminate(left)

    async def _refreshed(
        self, address: str, instances: Sequence[CloudInstance], lineage: str
    ) -> dict[str, Instance]:
        fleet = address.split(".", 1)[1]
        by_provider: dict[str, list[Instance]] = {}
        for i in instances:
            by_provider.setdefault(i.provider, []).append(i.as_instance(fleet))
        seen: dict[str, Instance] = {}
        for name, listed in by_provider.items():
            provider = self._clouds.provider(name, lineage, creating=False)
            seen.update({i.id: i for i in await provider.refresh(listed)})
        return seen

    def _providers(self, fleet_provider: str, lineage: str) -> list[Provider]:
        providers = self._clouds.providers(fleet_provider, lineage, creating=True)
        if not providers:
            reason = self._clouds.cannot_create(fleet_provider) or "no usable cloud backend"
            raise ProviderError(fleet_provider, reason)
        return providers


def _fleet(spec: Mapping[str, Any]) -> FleetSpec:
    from dstack_plan.config.fleet import FleetSpec

    fleet = spec_from_normalized("fleet", dict(spec))
    assert isinstance(fleet, FleetSpec)
    return fleet


async def _tagged(provider: Provider, fleet: str) -> list[Instance]:
    """The provider's instances its tags say belong to `fleet` (none if it cannot tell)."""
    if not isinstance(provider, ProviderWithTags):
        return []
    return await provider.tagged_instances(fleet)


async def _commit_grown(ctx: ApplyContext, entry: ResourceState, outcome: Outcome) -> State:
    """Write the grown fleet's entry, merged with what the stored one holds by then (another
    apply step may have recorded machines of its own), and return the state written."""
    grown = CloudFleetRecord.model_validate(outcome.attributes)
    now = timestamp(ctx.clock)

    def mutate(state: State) -> State:
        stored = state.get(entry.address) or entry
        ids = {i.id for i in grown.instances}
        instances = [*grown.instances]
        instances += [i for i in CloudFleetRecord.of(stored).instances if i.id not in ids]
        hosts = FleetRecord.model_validate(outcome.attributes)
        names = {h.name for h in hosts.hosts}
        merged_hosts = hosts.model_copy(
            update={
                "hosts": (
                    *hosts.hosts,
                    *(h for h in FleetRecord.of(stored).hosts if h.name not in names),
                )
            }
        )
        record = grown.with_instances(instances)
        attributes = {**stored.attributes, **_attributes(record, merged_hosts)}
        return state.with_resource(
            stored.updated(now=now, status=outcome.status, attributes=attributes)
        )

    if ctx.commit is None:
        return mutate(ctx.current_state())
    return await ctx.commit(mutate)


def _alive(record: CloudFleetRecord, seen: Mapping[str, Instance]) -> CloudFleetRecord:
    """`record` without the machines the provider no longer lists, the others as seen now."""
    return record.with_instances(i.seen(seen[i.id]) for i in record.instances if i.id in seen)


def _status(record: CloudFleetRecord, hosts: FleetRecord, target: int) -> str:
    """`active` when the fleet has its machines and every one answers, else `degraded`."""
    if len(record.instances) < target or hosts.status != "active":
        return "degraded"
    return "active"


def _attributes(record: CloudFleetRecord, hosts: FleetRecord) -> dict[str, object]:
    return {**hosts.to_attributes(), **record.to_attributes()}


async def _save(ctx: ApplyContext, address: str, attributes: dict[str, object]) -> None:
    """Record the fleet's instances in the stored entry now, mid-operation: a process killed
    while they boot leaves them in state, for the next apply or destroy."""
    if ctx.commit is None:
        return
    now = timestamp(ctx.clock)

    def mutate(state: State) -> State:
        stored = state.get(address)
        if stored is None:
            return state
        merged = {**stored.attributes, **attributes}
        return state.with_resource(stored.updated(now=now, attributes=merged))

    await ctx.commit(mutate)


async def _ssh_open(hostname: str, port: int = 22, timeout: float = 5.0) -> bool:
    """Whether something accepts connections on `hostname:port` (sshd has started)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(hostname, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return True
