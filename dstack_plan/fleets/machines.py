"""The machines runs go to, fleet by fleet, and the agents on them.

A fleet's machines come from one of two places. Some a provider has without being asked
(`Provider.implicit_instances`): the implicit fleet `local` has one, this machine. An SSH
fleet's machines are the hosts its state entry records: the fleet handler provisioned them,
pinned their host keys and recorded their resources, so placing a run costs no pre-flight,
only a job listing per host. A host whose last check failed is still listed (its jobs may
run) but is not `usable` for new jobs.

One provider per SSH fleet serves every request of a command (one SSH connection per host,
reused), until `close`. Within a command (`listings.kept()`), each machine's jobs are listed
once and the local machine's host facts read once (`fleets/listings.py`).

Reaching an SSH host's agent starts it (installs it if need be) when it does not run, unless
`start_agents` is off: then only an agent that runs is talked to, and a host without one does
not answer. Watch turns it off: only apply (creating or updating a fleet) puts agents on hosts,
so a watch tick that read the state before a destroy committed cannot bring back the agents
destroy just stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dstack_plan.errors import ProviderError
from dstack_plan.fleets.listings import JobListings, MachineKey
from dstack_plan.fleets.records import (
    FleetRecord,
    fleet_ssh_config,
    is_cloud_fleet,
    is_engine_fleet,
)
from dstack_plan.fleets.ssh import SSHProviderFactory
from dstack_plan.providers.base import Instance, MachineResources, Provider
from dstack_plan.providers.local import LOCAL_PROVIDER
from dstack_plan.providers.names import HOST_FLEET_PROVIDERS
from dstack_plan.providers.ssh.forward import Forward
from dstack_plan.providers.ssh.pins import MemoryHostKeyStore
from dstack_plan.sharing.imports import Imports, is_imported
from dstack_plan.state.identity_memo import IdentityMemo
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import JobInfo
    from dstack_plan.agent.client import AgentClient
    from dstack_plan.agent.jobs_api import JobsAPI
    from dstack_plan.config.fleet import SSHConfig
    from dstack_plan.providers.engine import ClusterEngine
    from dstack_plan.providers.ssh.connect import Connection
    from dstack_plan.providers.ssh.provider import SSHProvider

LOCAL_ADDRESS = "127.0.0.1"
"""Where the nodes of a run on the local fleet reach each other: they share this machine."""


@dataclass(frozen=True)
class Machine:
    """One machine of a fleet, as runs see it."""

    fleet: str
    provider: str
    host: str
    """How jobs name it (`JobRecord.host`, `Placement.hosts`): this machine's hostname on the
    local fleet, the host's name (`hostname`, or `hostname:port` off port 22) on an SSH one."""
    address: str
    """Where the other nodes of a multi-node run reach it (`DSTACK_NODES_IPS`): the host's
    `internal_ip` when the config gives one, else its hostname."""
    instance: Instance
    resources: MachineResources | None = None
    problem: str | None = None
    """Why its last check failed (unreachable, agent down); None when it answered."""

    @property
    def usable(self) -> bool:
        """It can take new jobs: its resources are known and its last check passed."""
        return self.resources is not None and self.problem is None


class FleetMachines:
    """Finds a fleet's machines and their agents, from the state that records the fleet."""

    def __init__(
        self,
        implicit: Provider,
        ssh_provider: SSHProviderFactory,
        *,
        start_agents: bool = True,
        imports: Imports | None = None,
    ):
        self.implicit = implicit
        """The provider of the fleets no resource creates (`local`: this machine)."""
        self._make_ssh = ssh_provider
        self._start_agents = start_agents
        self.imports = imports
        """Other projects' fleets (`owner/name`), found in their states; None: none."""
        self._ssh: dict[str, tuple[str, SSHProvider]] = {}
        """fleet name -> (its recorded ssh_config and pins as JSON, the provider built from
        them)."""
        self._retired: list[SSHProvider] = []
        self._engines: dict[str, tuple[str, ClusterEngine]] = {}
        """fleet name -> (what reaching its cluster depends on, the engine reaching it)."""
        self._retired_engines: list[ClusterEngine] = []
        self.listings = JobListings()
        """What the agents listed, kept for a command (`fleets/listings.py`)."""

    @property
    def start_agents(self) -> bool:
        """Whether reaching an SSH host's agent may start (or install) it; False: only
        agents that run are talked to (see the module doc). The implicit machine's agent
        (this machine's, shared by every project) is started either way."""
        return self._start_agents

    @start_agents.setter
    def start_agents(self, value: bool) -> None:
        self._start_agents = value
        for fleet, (_, provider) in self._ssh.items():
            provider.start_agents = value and not is_imported(fleet)
        for provider in self._retired:
            provider.start_agents = value

    def check_placeable(self, fleet: str) -> None:
        """Raise NotImported when `fleet` is another project's that no export shares with
        this project now: new jobs may not go there (what runs there is left alone)."""
        if is_imported(fleet):
            self._imports().fleet(fleet, placing=True)

    async def machines(self, fleet: str, state: State) -> list[Machine]:
        """The machines of `fleet`: the local one refreshed now (host facts, a fraction of a
        second), an SSH fleet's hosts as `state` last recorded them (no I/O).

        Raises ProviderError when `state` has no such fleet (not applied yet)."""
        implicit = self.implicit.implicit_instances(fleet)
        if implicit:
            return await self._implicit_machines(fleet, implicit)
        if self.is_engine(fleet, state):
            return []  # the cluster's scheduler places the jobs: no machine is ours
        entry = self._entry(fleet, state)
        found = _RECORDED_MACHINES.get(entry)
        if found is None or found[0] != fleet:  # another name for it: an imported fleet
            provider = self._provider(fleet, entry)
            found = (fleet, _recorded_machines(fleet, entry, provider))
            _RECORDED_MACHINES.put(entry, found)
        return list(found[1])

    def has_host(self, fleet: str, host: str, state: State) -> bool:
        """Whether `fleet` still has the machine `host` (no I/O). A fleet of implicit
        machines always has: its one machine goes by several names (`localhost`, hostname)."""
        if self.implicit.implicit_instances(fleet) or self.is_engine(fleet, state):
            return True
        entry = self._entry(fleet, state)
        return any(h.name == host for h in FleetRecord.of(entry).hosts)

    def is_engine(self, fleet: str, state: State) -> bool:
        """Whether `fleet` is capacity on a cluster whose scheduler runs the jobs (Slurm,
        Kubernetes): its jobs are reached through `jobs_api`, and it has no agents (no I/O)."""
        if self.implicit.implicit_instances(fleet):
            return False
        entry = self.recorded(fleet, state)
        return entry is not None and is_engine_fleet(entry)

    async def jobs_api(self, fleet: str, host: str, state: State) -> JobsAPI:
        """What runs the jobs of `fleet`'s machine `host`: its agent, or, on an engine fleet,
        the cluster (`host` is then the cluster's name). No I/O until its first request."""
        if self.is_engine(fleet, state):
            return self.engine(fleet, state).jobs()
        return await self.agent(fleet, host, state)

    def engine(self, fleet: str, state: State) -> ClusterEngine:
        """The engine of engine fleet `fleet`, kept until `close` (no I/O yet)."""
        entry = self.recorded(fleet, state)
        if entry is None or not is_engine_fleet(entry):
            raise ProviderError("fleet", f"fleet {fleet!r} is not an engine fleet in state")
        return self.engine_of(entry)

    def engine_of(self, entry: ResourceState) -> ClusterEngine:
        """The engine reaching the cluster engine fleet `entry` records (`fleets/engines.py`);
        one per fleet, made anew when what reaching it depends on changes."""
        from dstack_plan.fleets.engines import identity, make_engine

        fleet = entry.address.split(".", 1)[1]
        key = identity(entry)
        cached = self._engines.get(fleet)
        if cached is not None and cached[0] == key:
            return cached[1]
        if cached is not None:
            self._retired_engines.append(cached[1])
        engine = make_engine(entry)
        self._engines[fleet] = (key, engine)
        return engine

    async def agent(self, fleet: str, host: str, state: State) -> AgentClient:
        """The agent on `fleet`'s machine `host` (as jobs record it); no I/O until its first
        request. On a fleet of implicit machines, a `host` it does not know is its first
        machine (the local fleet's older records say `localhost`)."""
        implicit = self.implicit.implicit_instances(fleet)
        if implicit:
            named = [i for i in implicit if i.hostname == host]
            return await self.implicit.agent((named or implicit)[0])
        provider, instance = self._ssh_host(fleet, host, state)
        return await provider.agent(instance)

    async def jobs(
        self,
        fleet: str,
        host: str,
        state: State,
        run_name: str | None = None,
        agent: JobsAPI | None = None,
    ) -> list[JobInfo]:
        """The jobs the agent of `fleet`'s machine `host` (`agent`, when the caller has it;
        the cluster of an engine fleet) lists, oldest first (only those of `run_name` when
        given): once per machine within a command (`listings`), else asked now."""
        if agent is None:
            agent = await self.jobs_api(fleet, host, state)
        if not self.listings.active:
            return await agent.list_jobs(run_name=run_name)
        return await self.listings.jobs(self.machine_key(fleet, host), agent.list_jobs, run_name)

    def start_jobs(self, fleet: str, host: str, agent: JobsAPI) -> None:
        """Ask `agent` (`fleet`'s machine `host`) for its jobs now, for a later `jobs` of
        this command to answer from, without waiting (`JobListings.start`)."""
        self.listings.start(self.machine_key(fleet, host), agent.list_jobs)

    def machine_key(self, fleet: str, host: str) -> MachineKey:
        """Which machine `fleet`'s `host` is, for `listings` (no I/O): a fleet of implicit
        machines names one by several names, as `agent` resolves them."""
        implicit = self.implicit.implicit_instances(fleet)
        if implicit:
            named = [i for i in implicit if i.hostname == host]
            return fleet, (named or implicit)[0].id
        return fleet, host

    async def forward(
        self,
        fleet: str,
        host: str,
        state: State,
        remote_port: int,
        local_port: int = 0,
        address: str | None = None,
    ) -> Forward:
        """`remote_port` of `fleet`'s machine `host`, reachable on this machine's 127.0.0.1:
        through an SSH forward from `local_port` (0: any free one) for an SSH host; as it is
        (local port = `remote_port`, nothing forwarded) on the implicit machines, this one;
        on an engine fleet, `address` in the cluster (where the job runs: its published port's
        `host_ip`) as the engine reaches it. Raises OSError when `local_port` cannot be
        bound."""
        if self.implicit.implicit_instances(fleet):
            return Forward.direct(host, remote_port)
        if self.is_engine(fleet, state):
            if address is None:
                raise ProviderError(
                    "fleet", f"fleet {fleet!r}: where the job runs is not known yet"
                )
            return await self.engine(fleet, state).forward(address, remote_port, local_port)
        provider, instance = self._ssh_host(fleet, host, state)
        return await provider.forward_port(instance, remote_port, local_port)

    async def connection(self, fleet: str, host: str, state: State) -> Connection:
        """The SSH connection to host `host` of SSH fleet `fleet` (its pinned key), pooled
        until `close`. ProviderError for a fleet of implicit machines or no such host."""
        if self.implicit.implicit_instances(fleet):
            raise ProviderError(
                self.implicit.name, f"fleet {fleet!r} is not an SSH fleet: it has no SSH hosts"
            )
        provider, instance = self._ssh_host(fleet, host, state)
        return await provider.connection(instance)

    def _ssh_host(self, fleet: str, host: str, state: State) -> tuple[SSHProvider, Instance]:
        """The provider of SSH (or booted cloud) fleet `fleet` and its host `host`, as jobs
        and gateways record it; ProviderError when the fleet has no such host."""
        entry = self._entry(fleet, state)
        provider = self._provider(fleet, entry)
        instance = provider.host_instance(fleet, host)
        if instance is not None:
            return provider, instance
        raise ProviderError(
            entry.provider,
            f"fleet {fleet!r} has no host {host!r} (removed from it: the jobs recorded there "
            "were stopped, and the next apply starts their runs again on the hosts it has)",
            host,
        )

    async def close(self) -> None:
        for provider in [*(p for _, p in self._ssh.values()), *self._retired]:
            await provider.close()
        self._ssh.clear()
        self._retired.clear()
        for engine in [*(e for _, e in self._engines.values()), *self._retired_engines]:
            await engine.close()
        self._engines.clear()
        self._retired_engines.clear()
        await self.implicit.close()

    async def _implicit_machines(self, fleet: str, implicit: list[Instance]) -> list[Machine]:
        provider = self.implicit
        # host facts once per command: an apply of N runs asked them N times
        found = await self.listings.implicit(fleet, lambda: provider.refresh(implicit))
        if not found or any(i.resources is None for i in found):
            raise ProviderError(provider.name, "this machine's resources are not known")
        return [
            Machine(
                fleet=i.fleet,
                provider=provider.name,
                host=i.hostname,
                address=LOCAL_ADDRESS if provider.name == LOCAL_PROVIDER else i.hostname,
                instance=i,
                resources=i.resources,
            )
            for i in found
        ]

    def recorded(self, fleet: str, state: State) -> ResourceState | None:
        """The state entry of SSH or cloud fleet `fleet` (another project's as this project
        reaches it); None when there is none."""
        if is_imported(fleet):
            return self._imports().fleet(fleet, placing=False)
        return state.get(f"fleet.{fleet}")

    def _imports(self) -> Imports:
        if self.imports is None:
            raise ProviderError("fleet", "this command does not use other projects' fleets")
        return self.imports

    def _entry(self, fleet: str, state: State) -> ResourceState:
        if is_imported(fleet):
            entry: ResourceState | None = self._imports().fleet(fleet, placing=False)
        else:
            entry = state.get(f"fleet.{fleet}")
        if entry is None:
            raise ProviderError("fleet", f"fleet {fleet!r} is not in state: apply it first")
        if is_engine_fleet(entry):
            raise ProviderError(
                entry.provider, f"fleet {fleet!r} is a {entry.provider} cluster: its nodes are "
                "its scheduler's, with no agent of ours"
            )  # fmt: skip
        if entry.provider not in HOST_FLEET_PROVIDERS:
            raise ProviderError(
                entry.provider, f"fleet {fleet!r}: runs on {entry.provider} fleets are not "
                "supported in this version"
            )  # fmt: skip
        return entry

    def kept_provider(self, entry: ResourceState) -> SSHProvider:
        """The provider of the SSH fleet `entry` records, kept (with its connections and
        agent clients) until `close`: what refreshing the fleet uses, so a long-lived process
        (watch) asks its hosts over the same connections tick after tick."""
        fleet = entry.address.split(".", 1)[1]
        return self._provider(fleet, entry)

    def _provider(self, fleet: str, entry: ResourceState) -> SSHProvider:
        config, pins, key = _provider_parts(entry)
        cached = self._ssh.get(fleet)
        if cached is not None and cached[0] == key:
            return cached[1]
        if cached is not None:
            self._retired.append(cached[1])  # its connections are closed with the others
        provider = self._make_ssh(fleet, config, MemoryHostKeyStore(dict(pins)))
        # only the owner's apply puts agents on its hosts: an importer talks to those that run
        provider.start_agents = self._start_agents and not is_imported(fleet)
        self._ssh[fleet] = (key, provider)
        return provider


def _provider_parts(entry: ResourceState) -> tuple[SSHConfig, dict[str, str], str]:
    """`_provider_key` of `entry`, worked out once per entry."""
    return _PROVIDER_KEYS.get_or_make(entry, _provider_key)


def _provider_key(entry: ResourceState) -> tuple[SSHConfig, dict[str, str], str]:
    """What an SSH provider for fleet `entry` is made of (its config and pinned host keys),
    and those two as a key: a provider made from another key is made anew. Pinned keys too:
    after `dstack fleet trust` a long-lived watch must connect with the new pin, not keep
    refusing the host with the old one."""
    config = ssh_config_of(entry)
    pins = FleetRecord.of(entry).pins()
    return config, pins, json.dumps([config.model_dump(mode="json"), pins], sort_keys=True)


def _recorded_machines(
    fleet: str, entry: ResourceState, provider: SSHProvider
) -> tuple[Machine, ...]:
    """The hosts SSH (or booted cloud) fleet `entry` records, as machines."""
    config = _provider_parts(entry)[0]
    instances = {i.id: i for i in provider.host_instances(fleet)}
    addresses = {config.host_name(h): h.internal_ip or h.hostname for h in config.hosts}
    machines = []
    for host in FleetRecord.of(entry).hosts:
        instance = instances.get(host.instance_id)
        if instance is None:  # recorded, but no longer in the recorded config
            continue
        machines.append(
            Machine(
                fleet=fleet,
                provider=entry.provider,
                host=host.name,
                address=addresses.get(host.name, host.hostname),
                instance=instance,
                resources=host.resources,
                problem=host.problem,
            )
        )
    return tuple(machines)


_RECORDED_MACHINES: IdentityMemo[ResourceState, tuple[str, tuple[Machine, ...]]] = IdentityMemo()
"""The fleet's name and its `_recorded_machines`, by fleet entry: an apply places each of its
runs on the machines of its fleet, and making them anew for each run cost as much as placing
it."""

_PROVIDER_KEYS: IdentityMemo[ResourceState, tuple[SSHConfig, dict[str, str], str]] = IdentityMemo()
"""`_provider_key` by fleet entry: a watch tick looks up a fleet's provider for each of its
hosts, and parsing its spec each time made the tick quadratic in hosts."""


def ssh_config_of(entry: ResourceState) -> SSHConfig:
    """The `ssh_config` a fleet's state entry records: an SSH fleet's own, or the one that
    reaches a cloud fleet's booted machines (`cloud_records.cloud_ssh_config`)."""
    if is_cloud_fleet(entry):
        from dstack_plan.fleets.cloud_records import CloudFleetRecord, cloud_ssh_config

        return cloud_ssh_config(CloudFleetRecord.of(entry))
    return fleet_ssh_config(entry.spec, entry.address)[1]
