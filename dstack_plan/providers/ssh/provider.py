"""The `ssh` provider: a fleet's on-prem hosts, each running an agent reached through SSH.

    provider = SSHProvider({"gpus": targets}, host_keys=store)
    instances = await provider.create_instances("gpus", offer, len(targets))
    client = await provider.agent(instances[0])    # an AgentClient through the tunnel

An SSH fleet's machines are the hosts its config lists: `create_instances` takes them all
(pre-flight, install the agent, read its host facts), the offer says nothing about them. A host
that fails does not fail the others: it comes back partial (`status` `pending`, no
`resources`), and `problems` says what went wrong with it. Its fleets are given to the
constructor: `Project.ssh_provider` builds one per SSH fleet for `fleets/ssh.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dstack_plan.agent.client import AgentClient
from dstack_plan.agent.deferred_client import DeferredAgentClient
from dstack_plan.agent.http import Response
from dstack_plan.errors import AgentError, DstackPlanError, ProviderError, SSHError
from dstack_plan.providers.base import Instance, Offer, Provider
from dstack_plan.providers.local import resources_from_facts
from dstack_plan.providers.ssh.claims import Enrollment, HostOwners, Release
from dstack_plan.providers.ssh.connect import Connection, SSHPool
from dstack_plan.providers.ssh.forward import Forward, open_forward
from dstack_plan.providers.ssh.hostkeys import HostKeyPolicy, HostKeyStore, MemoryHostKeyStore
from dstack_plan.providers.ssh.install import (
    DEFAULT_AGENT_DIR,
    AgentBundle,
    RemoteAgent,
    cached_bundle,
    find_agent,
    forget_claim,
    install_agent,
    read_owners,
    stop_agent,
)
from dstack_plan.providers.ssh.models import SSHTarget
from dstack_plan.providers.ssh.preflight import preflight
from dstack_plan.providers.ssh.tunnel import AGENT_ADDRESS, tunnel

if TYPE_CHECKING:
    from dstack_plan.clock import Clock
    from dstack_plan.config.resources import ResourcesSpec

log = logging.getLogger(__name__)

SSH_PROVIDER = "ssh"
T = TypeVar("T")

FORCED_STOP_MARGIN = 15.0
"""Seconds past a job's own stop window that a forced teardown waits for it to end."""
REFRESH_HOST_TIMEOUT = 60.0
"""Seconds a refresh waits for one host (it may have to start or install the agent again):
a host that takes longer is reported with the others, not waited for."""


class SSHProvider(Provider):
    """The hosts of SSH fleets (`fleets`: fleet name -> its hosts), one agent on each."""

    name = SSH_PROVIDER

    def __init__(
        self,
        fleets: Mapping[str, Sequence[SSHTarget]] | None = None,
        *,
        host_keys: HostKeyStore | None = None,
        known_hosts: Path | None = None,
        bundle: AgentBundle | None = None,
        agent_dir: str = DEFAULT_AGENT_DIR,
        need_containers: bool = False,
        need_gpu_containers: bool = True,
        concurrency: int = 16,
        connect_timeout: float = 10.0,
        clock: Clock | None = None,
        start_agents: bool = True,
    ):
        self.fleets = {name: list(targets) for name, targets in (fleets or {}).items()}
        self.enrollment: Enrollment | None = None
        """Who owns each host it provisions: checked before the agent is touched, recorded
        after (None: nothing is checked or recorded)."""
        self.release: Release | None = None
        """The claim `terminate` releases on each host before deciding to stop its agent
        (None: the agent is stopped, whoever else uses it)."""
        self.left_running: dict[str, str] = {}
        """Host -> why `terminate` kept its agent running (another project's claim or jobs)."""
        self.start_agents = start_agents
        """Whether reaching a host's agent may install or start it (apply). False: only an
        agent that runs is talked to; a host without one fails the request (watch, which
        must never bring back an agent that destroy stopped)."""
        self.agent_dir = agent_dir
        """Where the agent goes on each host: relative to the login user's home unless
        absolute."""
        self.need_containers = need_containers
        """Its runs use `image:`: pre-flight checks Docker."""
        self.need_gpu_containers = need_gpu_containers
        """Some of them want GPUs: pre-flight checks Docker's NVIDIA runtime on GPU hosts."""
        self.policy = HostKeyPolicy(host_keys or MemoryHostKeyStore(), known_hosts=known_hosts)
        self.pool = SSHPool(
            self.policy, concurrency=concurrency, connect_timeout=connect_timeout, clock=clock
        )
        self.problems: dict[str, str] = {}
        """Instance name -> why the host failed the last create/refresh (cleared when it
        answers again)."""
        self.installed: dict[str, RemoteAgent] = {}
        """Instance id -> the agent the last install found or started there."""
        self._bundle = bundle
        self._bundle_lock = asyncio.Lock()
        self._limit = asyncio.Semaphore(concurrency)
        self._clients: dict[str, SSHAgentClient] = {}

    # -- the contract ------------------------------------------------------------------------

    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        """None: an SSH fleet's machines are the hosts its config lists, not offers."""
        return []

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        """Every host of `fleet` as an instance, the agent installed and started on each
        (seconds per host, hosts side by side; `offer` is not used). `count` must be the number
        of hosts. A host that fails comes back partial, with the reason in `problems`."""
        hosts = self._hosts(fleet)
        if count != len(hosts):
            raise ProviderError(
                self.name, f"the fleet has {len(hosts)} host(s), not {count}", f"fleet.{fleet}"
            )
        instances = self.host_instances(fleet)
        done = await self._each(instances, self._provision)
        return [i for i in done if i is not None]  # a failed host comes back, never None

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        """Each of ours with its host facts now. A host that does not answer stays (it still
        exists) as `pending`, with the reason in `problems`. An instance being terminated is
        left out once its agent no longer runs. A live instance whose agent does not run (the
        host rebooted) gets it started again, as any first request does. Hosts no longer
        listed in their fleet's config are left out."""
        mine = [i for i in instances if self._target(i) is not None]
        found = await self._each(mine, self._observe, timeout=REFRESH_HOST_TIMEOUT)
        return [i for i in found if i is not None]

    async def terminate(self, instances: Sequence[Instance]) -> None:
        """Stop the agent on each host (its files and any job containers stay). Idempotent;
        raises one ProviderError naming every host that could not be reached, after trying all
        of them.

        With `release` set, the fleet's claim on each host is released first, and the agent
        is stopped only when no claim and no unfinished job of any project remains there
        (`left_running` says why for each host where it was kept); with `release.force`,
        unfinished jobs are stopped first (another project's claim still keeps the agent)."""

        async def stop(instance: Instance) -> str | None:
            target = self._target(instance)
            if target is None:
                return None
            client = self._clients.pop(instance.id, None)
            if client is not None:
                await client.aclose()
            try:
                conn = await self.pool.connect(target)
                if self.release is not None:
                    kept = await self._release(conn, target, self.release)
                    if kept is not None:
                        self.left_running[target.name] = kept
                        return None
                await stop_agent(conn, target.name, agent_dir=self.agent_dir)
            except DstackPlanError as e:
                return str(e)
            self.installed.pop(instance.id, None)
            return None

        failures = [f for f in await self._bounded([partial(stop, i) for i in instances]) if f]
        if failures:
            raise ProviderError(self.name, "could not stop every agent: " + "; ".join(failures))

    async def agent(self, instance: Instance) -> AgentClient:
        """The agent on `instance`'s host through an SSH tunnel, started (installed if need be)
        when the first request needs it. No I/O here; the same client until `close`."""
        target = self._target(instance)
        if target is None:
            raise ProviderError(self.name, "not a host of an SSH fleet here", instance.name)
        client = self._clients.get(instance.id)
        if client is None:
            client = self._clients[instance.id] = SSHAgentClient(self, instance, target)
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        await self.pool.close()

    async def forward_port(
        self, instance: Instance, remote_port: int, local_port: int = 0
    ) -> Forward:
        """Forward 127.0.0.1:`local_port` here (0: any free port; never every address) to
        127.0.0.1:`remote_port` on `instance`'s host, over its pooled SSH connection. Close the
        forward before `close`. Raises OSError when the local port cannot be bound, SSHError
        when the host cannot be reached."""
        target = self._target(instance)
        if target is None:
            raise ProviderError(self.name, "not a host of an SSH fleet here", instance.name)
        conn = await self.pool.connect(target)
        return await open_forward(conn, target.name, remote_port, local_port)

    async def connection(self, instance: Instance) -> Connection:
        """The pooled SSH connection to `instance`'s host (pinned host key), opened if need
        be; SSHError when the host cannot be reached. Closed by `close`."""
        target = self._target(instance)
        if target is None:
            raise ProviderError(self.name, "not a host of an SSH fleet here", instance.name)
        return await self.pool.connect(target)

    def host_instances(self, fleet: str) -> list[Instance]:
        """Every host of `fleet` as a partial instance (`provisioning`, no resources), as
        `create_instances` names them: what `refresh` and `terminate` take. No I/O."""
        return [self._instance(fleet, i, t) for i, t in enumerate(self.fleets.get(fleet, []))]

    def host_instance(self, fleet: str, host: str) -> Instance | None:
        """`fleet`'s host named `host` (`SSHTarget.name`) as `host_instances` gives it; None
        when the fleet has no such host. No I/O."""
        for index, target in enumerate(self.fleets.get(fleet, [])):
            if target.name == host:
                return self._instance(fleet, index, target)
        return None

    # -- helpers -----------------------------------------------------------------------------

    async def _release(self, conn: Connection, target: SSHTarget, release: Release) -> str | None:
        """Release the claim on the host; why its agent must keep running, or None when it
        may stop (nothing of anyone else is left there)."""
        running = await find_agent(conn, target.name, agent_dir=self.agent_dir)
        if running is None:  # no agent to ask: nothing runs under it; drop the claim file
            await forget_claim(
                conn, target.name, release.lineage, release.fleet, agent_dir=self.agent_dir
            )
            return None
        agent = self._client_of(target, running)
        try:
            left = await agent.release_claim(release.lineage, release.fleet)
            # another fleet's claim, this project's too (a fleet renamed: the new one enrolled
            # the host before the old one let go), keeps the agent
            mine = (release.lineage, release.fleet)
            owners = [c for c in left.claims if (c.lineage, c.fleet) != mine]
            if owners:
                return f"it belongs to {owners[0].describe()}"
            jobs = left.unfinished_jobs
            if jobs and not release.force:
                runs = ", ".join(sorted({j.run_name for j in jobs}))
                return (
                    f"jobs run there that this project does not own ({runs}; --force stops them)"
                )
            await agent.drain(jobs)  # --force: named by the caller, each within its window
        finally:
            await agent.aclose()
        return None

    def _client_of(self, target: SSHTarget, remote: RemoteAgent) -> AgentClient:
        """A plain client of the agent `remote` describes, through the host's tunnel."""

        async def connection() -> Connection:
            return await self.pool.connect(target)

        return AgentClient(
            f"http://{AGENT_ADDRESS}:{remote.port}",
            remote.token,
            host=target.name,
            connect=tunnel(connection, remote.port),
            # a refused channel is quick to tell; SSHAgentClient then finds the agent again
            retries=1,
        )

    async def connect_agent(self, instance: Instance, target: SSHTarget) -> AgentClient:
        """Install/start the agent on the host if needed (only find it running, unless
        `start_agents`) and return a plain client through the tunnel (what `SSHAgentClient`
        delegates to)."""
        conn = await self.pool.connect(target)
        if self.start_agents:
            remote = await install_agent(
                conn, target.name, await self.bundle(), agent_dir=self.agent_dir
            )
        else:
            found = await find_agent(conn, target.name, agent_dir=self.agent_dir)
            if found is None:
                raise AgentError(target.name, "no agent runs there (apply starts it)")
            remote = found
        self.installed[instance.id] = remote
        return self._client_of(target, remote)

    async def bundle(self) -> AgentBundle:
        """The agent bundle to install: the one given, else the build of the current sources
        from the bundle cache (built there once per set of sources: `bundle.py`)."""
        async with self._bundle_lock:
            if self._bundle is None:
                self._bundle = await asyncio.to_thread(cached_bundle)
            return self._bundle

    async def _provision(self, instance: Instance, target: SSHTarget) -> Instance:
        conn = await self.pool.connect(target)
        report = await preflight(
            conn,
            target.name,
            need_containers=self.need_containers,
            need_gpu_containers=self.need_gpu_containers,
            agent_dir=self.agent_dir,
        )
        report.raise_for_failures()
        enrollment = self.enrollment
        if enrollment is not None:  # refused before the agent there is touched at all
            owners = await read_owners(conn, target.name, agent_dir=self.agent_dir)
            await enrollment.before_install(target.name, owners)
        done = await self._facts(instance, target)
        if enrollment is not None:
            await enrollment.after_install(target.name, await self.agent(instance))
        return done

    async def host_owners(self, instance: Instance) -> HostOwners:
        """Who has `instance`'s host (its agent's claims, other agents serving it), read over
        SSH: nothing is installed or started (plan asks this). SSHError when the host cannot
        be reached."""
        target = self._target(instance)
        if target is None:
            raise ProviderError(self.name, "not a host of an SSH fleet here", instance.name)
        conn = await self.pool.connect(target)
        return await read_owners(conn, target.name, agent_dir=self.agent_dir)

    async def _observe(self, instance: Instance, target: SSHTarget) -> Instance | None:
        if instance.status not in ("terminating", "terminated"):
            return await self._facts(instance, target)
        conn = await self.pool.connect(target)
        running = await find_agent(conn, target.name, agent_dir=self.agent_dir)
        return None if running is None else instance

    async def _facts(self, instance: Instance, target: SSHTarget) -> Instance:
        client = await self.agent(instance)
        facts = await client.host_facts()
        status = "idle" if instance.status in ("pending", "provisioning") else instance.status
        return instance.model_copy(
            update={"resources": resources_from_facts(facts), "status": status}
        )

    async def _each(
        self,
        instances: Sequence[Instance],
        step: Callable[[Instance, SSHTarget], Awaitable[Instance | None]],
        timeout: float | None = None,
    ) -> list[Instance | None]:
        """`step` on every instance, side by side (bounded); a failing host (or one taking
        longer than `timeout` seconds) is kept (`pending` unless it is being terminated) with
        its reason in `problems`, the others are not affected."""

        async def one(instance: Instance) -> Instance | None:
            target = self._target(instance)
            assert target is not None
            try:
                done = await _within(step(instance, target), timeout, target.name)
            except DstackPlanError as e:
                # recorded in `problems`, which the caller reports (an apply, in the failure
                # of its resource): a warning here would say it twice
                log.info("%s", e)
                self.problems[instance.name] = str(e)
                if instance.status in ("terminating", "terminated"):
                    return instance
                return instance.model_copy(update={"status": "pending"})
            self.problems.pop(instance.name, None)
            return done

        return await self._bounded([partial(one, i) for i in instances])

    async def _bounded(self, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
        async def limited(call: Callable[[], Awaitable[T]]) -> T:
            async with self._limit:
                return await call()

        return list(await asyncio.gather(*(limited(c) for c in calls)))

    def _hosts(self, fleet: str) -> list[SSHTarget]:
        hosts = self.fleets.get(fleet)
        if not hosts:
            raise ProviderError(self.name, "no hosts are configured for it", f"fleet.{fleet}")
        return hosts

    def _instance(self, fleet: str, index: int, target: SSHTarget) -> Instance:
        return Instance(
            provider=self.name,
            id=_instance_id(target),
            name=f"{fleet}-{index}",
            fleet=fleet,
            hostname=target.hostname,
            region="on-prem",
            status="provisioning",
        )

    def _target(self, instance: Instance) -> SSHTarget | None:
        if instance.provider != self.name:
            return None
        for target in self.fleets.get(instance.fleet, []):
            if _instance_id(target) == instance.id:
                return target
        return None


def _instance_id(target: SSHTarget) -> str:
    return f"ssh:{target.name}"


class SSHAgentClient(DeferredAgentClient):
    """The agent on one SSH host, connected (and started) when the first request needs it.

    A request that cannot reach the agent is tried once more after finding the agent again
    (started again if it died, as after a reboot; on its new port): every request is safe to
    repeat.
    """

    def __init__(self, provider: SSHProvider, instance: Instance, target: SSHTarget):
        super().__init__(host=target.name)
        self._provider = provider
        self._instance = instance
        self._target = target

    async def _open(self) -> AgentClient:
        return await self._provider.connect_agent(self._instance, self._target)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Response:
        for attempt in range(2):
            agent = await self._connected()
            try:
                return await agent._request(method, path, **kwargs)
            except AgentError as e:
                if e.status is not None or attempt:  # the agent answered, or we retried
                    raise
                async with self._lock:  # not reached: it died or moved; find or start it
                    if self._agent is agent:
                        self._agent = None
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._agent = None


async def _within(step: Awaitable[T], timeout: float | None, host: str) -> T:
    """`step`, or an SSHError naming `host` when it takes longer than `timeout` seconds."""
    if timeout is None:
        return await step
    try:
        return await asyncio.wait_for(step, timeout)
    except asyncio.TimeoutError:
        raise SSHError(host, f"no answer within {timeout:g}s") from None
