"""SSH fleets made real: every listed host checked, given the agent, and asked for its facts.

A fleet's hosts are the ones its `ssh_config` lists; the `ssh` provider does the work on each
(pre-flight, agent install over SFTP, host facts). What happens when a host fails:
- create: the others are provisioned all the same (their agents keep running), and the
  create fails naming each failed host and why. State keeps the entry tainted, as for any
  failed create, with the hosts it reached recorded, so the next apply replaces it: it stops
  the agents it installed and provisions every host again (a host with the same agent build
  gets no upload). A host that never got an agent needs nothing stopped: a create that failed
  before reaching any host (a wrong user, a key with a passphrase, a host that does not
  answer) is replaced or destroyed without connecting to it with the settings that failed;
- update (hosts added or removed): removed hosts' agents are stopped, added hosts are
  provisioned; a failed added host fails the update, and state keeps the old entry, so the
  next plan shows the same update again;
- refresh: a host that does not answer is recorded `unreachable` with the reason (the
  fleet `degraded`), never raised: plan goes on;
- delete: the agent is stopped on every host of the recorded spec that got one (idempotent),
  reached with the settings of the configuration that replaces the fleet where it lists the
  host. A host that cannot be reached fails the delete, saying what is left there; with
  `--force` it is forgotten instead, and the output says so.
Host keys are pinned in state per host (first use); a host presenting another key fails with
both fingerprints.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dstack_plan.apply.deployment import deployment_key
from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.apply.unsupported import UnsupportedHandler
from dstack_plan.errors import DstackPlanError, ProviderError
from dstack_plan.fleets.apply_probe import Prober, entry_for, probed
from dstack_plan.fleets.claims import Claimant, HostEnrollment, stale_reason
from dstack_plan.fleets.records import FleetRecord, HostRecord, fleet_ssh_config
from dstack_plan.plan.model import ResourceChange
from dstack_plan.providers.ssh.claims import Release
from dstack_plan.providers.ssh.pins import HostKeyStore, MemoryHostKeyStore
from dstack_plan.state.model import ResourceState, State, timestamp

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import JobInfo
    from dstack_plan.config.fleet import SSHConfig
    from dstack_plan.providers.base import Instance
    from dstack_plan.providers.ssh.provider import SSHProvider

SSH = "ssh"

SSHProviderFactory = Callable[[str, "SSHConfig", MemoryHostKeyStore], "SSHProvider"]
"""(fleet name, its ssh_config, the pins to check keys against) -> a provider of its hosts."""


class FleetHandler(ResourceHandler):
    """Fleets of the `ssh` provider (cloud fleets: `fleets/cloud.py`, which joins their
    machines through this one)."""

    def __init__(
        self,
        ssh_provider: SSHProviderFactory,
        kept: Callable[[ResourceState], SSHProvider],
        prober: Prober | None = None,
        claimant: Claimant | None = None,
    ):
        self._make = ssh_provider
        """A new provider of some hosts (create, update, delete: closed when done)."""
        self._claimant = claimant
        """Who claims the hosts this handler enrolls (`fleets/claims.py`); None: no claims."""
        self._kept = kept
        """The project's kept provider of a fleet in state (`FleetMachines.kept_provider`):
        refresh asks the hosts over connections that outlive it (watch, tick after tick)."""
        self._unsupported = UnsupportedHandler()
        self._prober = prober
        """Measures the links of a fleet just provisioned (`fleets/apply_probe.py`); None:
        never."""

    def cannot_create(self, kind: str, provider: str) -> str | None:
        return None if provider == SSH else self._unsupported.cannot_create(kind, provider)

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        assert change.after is not None
        name, config = fleet_ssh_config(change.after, change.address)
        record = await self.provision(
            name, config, FleetRecord(), change.address, ctx, on_failure=_record_reached(ctx)
        )
        record = await self._probed(change, record, ctx)
        return Outcome(record.status, record.to_attributes())

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        assert change.after is not None
        name, config = fleet_ssh_config(change.after, change.address)
        _, old_config = fleet_ssh_config(current.spec, current.address)
        old = FleetRecord.of(current)
        removed = old_config.hosts_leaving(config)
        if removed:
            gone = old_config.model_copy(update={"hosts": tuple(removed)})
            pins = MemoryHostKeyStore(old.pins())
            await self.drain(name, gone, pins, change.address, ctx)
            ctx.progress(change.address, f"stopping the agent on {len(removed)} removed host(s)")
            await self._terminate(name, gone, pins, change.address, ctx)
        wanted = {config.host_name(h) for h in config.hosts}
        kept = {n: h for n, h in old.by_name().items() if n in wanted}
        record = await self.provision(
            name, config, FleetRecord(hosts=tuple(kept.values())), change.address, ctx
        )
        record = await self._probed(change, record.with_bandwidth_of(old), ctx)
        return Outcome(record.status, record.to_attributes())

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        if not _is_ssh(current):  # nothing this version created: trust the state
            return await self._unsupported.refresh(current, ctx)
        name, config = fleet_ssh_config(current.spec, current.address)
        record = await self.refresh_hosts(name, config, current)
        return Refreshed(status=record.status, attributes=record.to_attributes())

    async def refresh_hosts(
        self, name: str, config: SSHConfig, current: ResourceState
    ) -> FleetRecord:
        """The hosts `config` lists (the one `current` records), asked now over the kept
        provider; a host that does not answer keeps what state knew, with the problem."""
        old = FleetRecord.of(current)
        provider = self._kept(current)
        found = await provider.refresh(_as_recorded(provider.host_instances(name), old))
        record = _record(provider, name, config, found, old, provider.policy.store)
        return record.with_bandwidth_of(old)

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        if not _is_ssh(current):  # nothing this version created: drop the record
            return await self._unsupported.delete(current, ctx)
        name, config = fleet_ssh_config(current.spec, current.address)
        record = FleetRecord.of(current)
        config = _with_agents(config, record, current.tainted)
        if not config.hosts:
            ctx.progress(current.address, "no host got an agent: nothing to stop")
            return
        pins = MemoryHostKeyStore(record.pins())
        # a tainted fleet's settings may be what failed: reach its hosts as the correction says
        successor = ctx.successor if current.tainted else None
        for part in _reached_as_configured(config, successor):
            try:
                await self._terminate(name, part, pins, current.address, ctx)
            except ProviderError as e:
                if not ctx.force:
                    raise ProviderError(
                        SSH,
                        f"{e.detail}; left there: the agent and its data dir (job records, "
                        "logs). Fix the host or its settings and destroy again, or pass "
                        "--force to forget it",
                        current.address,
                    ) from None
                ctx.progress(current.address, f"forgotten, as --force says: {e.detail}")

    async def provision(
        self,
        name: str,
        config: SSHConfig,
        kept: FleetRecord,
        address: str,
        ctx: ApplyContext,
        on_failure: Callable[[str, FleetRecord], Awaitable[None]] | None = None,
    ) -> FleetRecord:
        """Provision the hosts of `config` that `kept` does not hold; raise naming each host
        that failed, after all were tried (and after `on_failure` got the record of every
        host, the failed ones with their problem)."""
        done = kept.by_name()
        new = tuple(h for h in config.hosts if config.host_name(h) not in done)
        if not new:
            return _ordered(config, done)
        pins = MemoryHostKeyStore(kept.pins())
        todo = config.model_copy(update={"hosts": new})
        provider = self._make(name, todo, pins)
        provider.enrollment = self._enrollment(address, ctx)
        try:
            ctx.progress(address, f"installing the agent on {len(new)} host(s)")
            created = await provider.create_instances(name, _offer(), len(new))
            record = _record(provider, name, todo, created, FleetRecord(), pins)
        finally:
            await provider.close()
        failed = [h for h in record.hosts if h.problem]
        if failed:
            if on_failure is not None:
                await on_failure(address, _ordered(config, {**done, **record.by_name()}))
            reasons = "; ".join(h.problem or h.name for h in failed)  # each names its host
            raise ProviderError(
                SSH, f"{len(failed)} of {len(new)} host(s) failed: {reasons}", address
            )
        done.update(record.by_name())
        return _ordered(config, done)

    async def _probed(
        self, change: ResourceChange, record: FleetRecord, ctx: ApplyContext
    ) -> FleetRecord:
        assert change.after is not None
        entry = entry_for(change.address, change.after, record, ctx.clock)
        state = ctx.current_state()
        return await probed(
            self._prober, record, entry, state, lambda m: ctx.progress(change.address, m)
        )

    async def drain(
        self,
        name: str,
        config: SSHConfig,
        pins: MemoryHostKeyStore,
        address: str,
        ctx: ApplyContext,
    ) -> None:
        """Before hosts leave the fleet: refuse when jobs still run on them, unless
        `ctx.force` says to drain them (stop the jobs, each within its stop timeout).

        A host that cannot be asked is not in the way: nothing is known to run there."""
        provider = self._make(name, config, pins)
        try:
            busy: dict[str, list[JobInfo]] = {}
            for instance in provider.host_instances(name):
                agent = await provider.agent(instance)
                try:
                    jobs = [j for j in await agent.list_jobs() if not j.finished]
                except DstackPlanError:
                    continue
                if jobs:
                    busy[instance.hostname] = jobs
            if busy and not ctx.force:
                listed = "; ".join(
                    f"{host}: {', '.join(sorted({j.run_name for j in jobs}))}"
                    for host, jobs in busy.items()
                )
                raise ProviderError(
                    SSH,
                    f"removed hosts still run jobs ({listed}): stop those runs first, or "
                    "apply with --force to drain the hosts (their jobs are stopped)",
                    address,
                )
            for instance in provider.host_instances(name):
                jobs = busy.get(instance.hostname, [])
                if jobs:
                    ctx.progress(address, f"draining {instance.hostname}: {len(jobs)} job(s)")
                    agent = await provider.agent(instance)
                    await agent.drain(jobs)
        finally:
            await provider.close()

    def _enrollment(self, address: str, ctx: ApplyContext) -> HostEnrollment | None:
        """What provisioning `address`'s hosts checks and records about their owner."""
        if self._claimant is None:
            return None
        lineage = ctx.current_state().lineage
        claim = self._claimant.claim(lineage, deployment_key(lineage), address)
        return HostEnrollment(
            self._claimant, claim, stale_reason, lambda message: ctx.progress(address, message)
        )

    async def _terminate(
        self,
        name: str,
        config: SSHConfig,
        pins: MemoryHostKeyStore,
        address: str,
        ctx: ApplyContext,
    ) -> None:
        """Release the fleet's claim on the hosts of `config` and stop each agent nothing
        else needs; say where an agent keeps running, and why."""
        provider = self._make(name, config, pins)
        if self._claimant is not None:
            provider.release = Release(ctx.current_state().lineage, address, ctx.force)
        try:
            await provider.terminate(provider.host_instances(name))
        finally:
            await provider.close()
        for host, why in provider.left_running.items():
            ctx.progress(address, f"{host}: its agent keeps running: {why}")


def _record_reached(ctx: ApplyContext) -> Callable[[str, FleetRecord], Awaitable[None]]:
    """Record on the (tainted) intent entry the hosts a failed create reached, so that its
    replacement or destroy stops what it installed and leaves the others alone."""

    async def record(address: str, hosts: FleetRecord) -> None:
        if ctx.commit is None:
            return
        now = timestamp(ctx.clock)

        def mutate(state: State) -> State:
            entry = state.get(address)
            if entry is None or not entry.tainted:
                return state
            return state.with_resource(entry.updated(now=now, attributes=hosts.to_attributes()))

        await ctx.commit(mutate)

    return record


def _with_agents(config: SSHConfig, record: FleetRecord, tainted: bool) -> SSHConfig:
    """`config` with only the hosts that may have an agent: all of them, unless the entry is
    a create that failed and recorded which hosts it reached (those that got none are left
    out). A tainted entry that recorded nothing (a create cut short, or from an older
    version) may have installed on any."""
    if not tainted or not record.hosts:
        return config
    installed = {h.name for h in record.hosts if h.agent_sha256 or h.agent_version}
    hosts = tuple(h for h in config.hosts if config.host_name(h) in installed)
    return config.model_copy(update={"hosts": hosts})


def _reached_as_configured(
    config: SSHConfig, successor: Mapping[str, Any] | None
) -> list[SSHConfig]:
    """`config`'s hosts in groups to reach them by: those the configuration replacing the
    fleet (`successor`, a delete-then-create) also lists, with its settings (a corrected
    user, key or port), and the others with `config`'s."""
    if successor is None or not isinstance(successor.get("ssh_config"), dict):
        return [config]
    try:
        _, new = fleet_ssh_config(successor, "fleet.successor")
    except (ProviderError, ValueError):
        return [config]
    listed = {new.endpoint(h)[0]: h for h in new.hosts}
    names = [config.endpoint(h)[0] for h in config.hosts]
    moved = tuple(listed[n] for n in names if n in listed)
    stay = tuple(h for h, n in zip(config.hosts, names, strict=True) if n not in listed)
    groups = []
    if moved:
        groups.append(new.model_copy(update={"hosts": moved}))
    if stay:
        groups.append(config.model_copy(update={"hosts": stay}))
    return groups


def _is_ssh(current: ResourceState) -> bool:
    return current.provider == SSH and isinstance(current.spec.get("ssh_config"), dict)


def _ordered(config: SSHConfig, hosts: dict[str, HostRecord]) -> FleetRecord:
    names = [config.host_name(h) for h in config.hosts]
    return FleetRecord(hosts=tuple(hosts[n] for n in names if n in hosts))


def _as_recorded(instances: Sequence[Instance], old: FleetRecord) -> list[Instance]:
    """Instances of the config with the status state last saw (idle once provisioned)."""
    seen = {h.instance_id for h in old.hosts if h.resources is not None}
    return [i.model_copy(update={"status": "idle"}) if i.id in seen else i for i in instances]


def _record(
    provider: SSHProvider,
    name: str,
    config: SSHConfig,
    instances: Sequence[Instance],
    old: FleetRecord,
    pins: HostKeyStore,
) -> FleetRecord:
    """Host records from what the provider returned (in `config` order), keeping what `old`
    knew of a host that did not answer now."""
    from dstack_plan.providers.ssh.hostkeys import fingerprint

    by_id = {i.id: i for i in instances}
    before = old.by_name()
    hosts = []
    for partial_instance, host in zip(provider.host_instances(name), config.hosts, strict=True):
        host_name = config.host_name(host)
        hostname, port = config.endpoint(host)
        instance = by_id.get(partial_instance.id, partial_instance)
        problem = provider.problems.get(partial_instance.name)
        previous = before.get(host_name)
        agent = provider.installed.get(partial_instance.id)
        pin = pins.get(host_name)
        hosts.append(
            HostRecord(
                name=host_name,
                hostname=hostname,
                port=port,
                instance_id=partial_instance.id,
                status="unreachable" if problem else instance.status,
                resources=instance.resources or (previous.resources if previous else None),
                agent_version=agent.version if agent else _kept(previous, "agent_version"),
                agent_sha256=agent.sha256 if agent else _kept(previous, "agent_sha256"),
                agent_persistent=(
                    agent.persistent if agent else getattr(previous, "agent_persistent", None)
                ),
                host_key=pin,
                host_key_fingerprint=fingerprint(pin) if pin else None,
                problem=problem,
            )
        )
    return FleetRecord(hosts=tuple(hosts))


def _kept(previous: HostRecord | None, field: str) -> str | None:
    value = getattr(previous, field, None) if previous is not None else None
    return value if isinstance(value, str) else None


def _offer():  # noqa: ANN202 - the provider's Offer, unused by SSH fleets
    from dstack_plan.providers.base import MachineResources, Offer

    return Offer(
        provider=SSH,
        instance_type="ssh",
        region="on-prem",
        resources=MachineResources(cpus=0, memory_gb=0, disk_gb=0),
        price_per_hour=0.0,
    )
