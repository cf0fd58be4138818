"""Who owns an SSH host: the claim a fleet records on it when it enrolls it, checked before
the agent there is touched, and released when the host leaves the fleet.

A host has one owning fleet (`agent/claims.py` keeps it on the host). A fleet of another
project naming a claimed host is refused, naming the owner and the way out:

    10.0.0.5 belongs to fleet.onprem of project platform (state s3://b/platform.json); ...

`dstack apply --take-over` moves the claim deliberately (the agent refuses it while the
owner's jobs run there). A stale claim, whose owner's state no longer exists where the claim
says or no longer lists the host (and no job of that owner runs), is taken over with a
notice naming it. The owner's state is only ever read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dstack_plan.agent.api_models import HostClaim
from dstack_plan.agent.client import AgentClient
from dstack_plan.errors import AgentError, DstackPlanError, PlanError
from dstack_plan.plan.model import Action, Plan
from dstack_plan.providers.ssh.pins import MemoryHostKeyStore
from dstack_plan.state.model import State

if TYPE_CHECKING:
    from dstack_plan.config.fleet import SSHConfig
    from dstack_plan.providers.base import Instance
    from dstack_plan.providers.ssh.claims import HostOwners, OtherAgent
    from dstack_plan.providers.ssh.provider import SSHProvider

PLAN_CHECK_TIMEOUT = 15.0
"""Seconds `plan` gives a host to say who owns it; one that does not answer is left to apply."""
OWNER_BUSY = "owner_busy"
"""The agent's error code for a take-over refused while the owner's jobs run."""


class HostClaimedError(DstackPlanError):
    """A host another project's fleet owns; the message names the owner and the way out."""

    def __init__(self, host: str, owner: HostClaim, why: str = ""):
        self.host = host
        self.owner = owner
        super().__init__(f"{host} belongs to {owner.describe()}{why}")


class AnotherAgentError(DstackPlanError):
    """The host is served by another agent than the one this fleet reaches: another login
    user's, or another agent dir's. A host has one agent, which arbitrates its GPUs and
    records its owner; a second would hand out the same GPUs twice."""

    def __init__(self, host: str, other: OtherAgent):
        self.host = host
        self.other = other
        super().__init__(
            f"{host}: another agent serves this host ({other.describe()}); a host has one "
            f"agent: log in as {other.user} (ssh_config.user), or set "
            "DSTACK_PLAN_SSH_AGENT_DIR to the directory it uses"
        )


@dataclass(frozen=True)
class Claimant:
    """The project claiming hosts: its name and where its state lives (what another project
    is told), and whether it takes claimed hosts over (`apply --take-over`)."""

    project: str
    state: str
    take_over: bool = False

    def claim(self, lineage: str, deployment: str, fleet: str) -> HostClaim:
        return HostClaim(
            lineage=lineage, deployment=deployment, project=self.project, state=self.state,
            fleet=fleet,
        )  # fmt: skip


StaleCheck = Callable[[HostClaim, str], str | None]
"""(a claim, the host as its claimant names it) -> why the claim is stale, or None."""


class HostEnrollment:
    """The `providers.ssh.provider.Enrollment` of one fleet's provisioning: refuses hosts
    another project owns, takes over stale claims (and, with `take_over`, any), records the
    fleet's claim, and tells `progress` of each claim it took over."""

    def __init__(
        self,
        claimant: Claimant,
        claim: HostClaim,
        stale: StaleCheck,
        progress: Callable[[str], None],
    ):
        self._claimant = claimant
        self._claim = claim
        self._stale = stale
        self._progress = progress
        self._take: dict[str, str] = {}
        """host -> why its claim is taken over (stale, or --take-over)."""

    async def before_install(self, host: str, owners: HostOwners) -> None:
        if owners.others:
            raise AnotherAgentError(host, owners.others[0])
        owner = next((c for c in owners.claims if c.lineage != self._claim.lineage), None)
        if owner is None:
            return
        why = await asyncio.to_thread(self._stale, owner, host)
        if why is not None:
            self._take[host] = f"a stale claim of {owner.describe()}: {why}"
        elif self._claimant.take_over:
            self._take[host] = f"the claim of {owner.describe()}, as --take-over says"
        else:
            raise HostClaimedError(host, owner, way_out())

    async def after_install(self, host: str, agent: AgentClient) -> None:
        taking = host in self._take
        try:
            answer = await agent.claim(self._claim, take_over=taking)
        except AgentError as e:
            raise refusal(host, e) from None
        if answer.replaced is not None:
            self._progress(
                f"{host}: took over {self._take.get(host) or answer.replaced.describe()}"
            )


def refusal(host: str, error: AgentError) -> DstackPlanError:
    """The error to report for an agent's refusal of a claim (another project owns the host,
    and for a take-over, its jobs run there)."""
    owner_raw = (error.details or {}).get("owner")
    if error.status != 409 or not isinstance(owner_raw, dict):
        return error
    owner = HostClaim.model_validate(owner_raw)
    if error.code == OWNER_BUSY:
        jobs = ", ".join(str(j) for j in (error.details or {}).get("jobs") or [])
        return HostClaimedError(
            host, owner, f", whose jobs run there ({jobs}): --take-over waits until they end"
        )
    return HostClaimedError(host, owner, way_out())


def way_out() -> str:
    return (
        "; a host belongs to one fleet: remove it from this fleet, or move the claim "
        "deliberately with `dstack apply --take-over` (refused while the owner's jobs run)"
    )


def stale_reason(claim: HostClaim, host: str) -> str | None:
    """Why `claim` no longer holds (its owner's state is gone from where the claim says, is
    another state now, or no longer lists `host`), or None when it holds or the owner's
    state cannot be read (then the claim is respected). Reads, never writes, that state."""
    from dstack_plan.state.select import open_backend

    try:
        backend = open_backend(Path("."), claim.state)
        snapshot = backend.read()
    except (DstackPlanError, OSError):
        return None
    if not snapshot.exists:
        return f"its state no longer exists at {claim.state}"
    if snapshot.state.lineage != claim.lineage:
        return f"the state at {claim.state} is another state now"
    if not _lists(snapshot.state, claim.fleet, host):
        return f"its state no longer lists {host} in {claim.fleet}"
    return None


def _lists(state: State, fleet: str, host: str) -> bool:
    """Whether `state`'s fleet `fleet` lists `host` (`hostname` or `hostname:port`)."""
    entry = state.get(fleet)
    if entry is None:
        return False
    ssh = entry.spec.get("ssh_config")
    hosts = ssh.get("hosts") if isinstance(ssh, dict) else None
    if not isinstance(ssh, dict) or not isinstance(hosts, list):  # a cloud fleet's machines
        return True
    default_port = ssh.get("port") or 22
    name, _, port = host.partition(":")
    for listed in hosts:
        hostname, listed_port = listed, None
        if isinstance(listed, dict):
            hostname, listed_port = listed.get("hostname"), listed.get("port")
        if hostname == name and (not port or str(listed_port or default_port) == port):
            return True
    return False


async def claimed_hosts(
    provider: SSHProvider, fleet: str, lineage: str | None, claimant: Claimant
) -> list[str]:
    """What `plan` says of the hosts `provider` holds for `fleet` (new to it): one message per
    host another project's fleet owns, read over SSH without installing or starting anything.
    A host that cannot be reached is left to apply, which checks again."""

    async def one(instance: Instance) -> str | None:
        try:
            owners = await asyncio.wait_for(provider.host_owners(instance), PLAN_CHECK_TIMEOUT)
        except (DstackPlanError, OSError, asyncio.TimeoutError):
            return None
        if owners.others:
            return str(AnotherAgentError(instance.hostname, owners.others[0]))
        owner = next((c for c in owners.claims if c.lineage != lineage), None)
        if owner is None or claimant.take_over:
            return None
        host = instance.hostname
        if await asyncio.to_thread(stale_reason, owner, host) is not None:
            return None  # apply takes it over, saying so
        return str(HostClaimedError(host, owner, way_out()))

    found = await asyncio.gather(*(one(i) for i in provider.host_instances(fleet)))
    return [f for f in found if f is not None]


async def refuse_claimed_hosts(
    plan: Plan,
    lineage: str | None,
    ssh_provider: Callable[[str, SSHConfig, MemoryHostKeyStore], SSHProvider],
    claimant: Claimant,
) -> None:
    """PlanError naming each host another project's fleet owns among those `plan` adds to
    SSH fleets of the state of `lineage` (None: a state not written yet); asked over SSH
    through providers `ssh_provider` makes, which start nothing."""
    from dstack_plan.fleets.records import fleet_ssh_config

    refused: list[str] = []
    for change in plan.changes:
        if change.kind != "fleet" or change.after is None or change.action is Action.NOOP:
            continue
        if not isinstance(change.after.get("ssh_config"), dict):
            continue
        name, config = fleet_ssh_config(change.after, change.address)
        known = set()
        if change.before is not None and not change.action.is_replace:
            _, old = fleet_ssh_config(change.before, change.address)
            known = {old.endpoint(h) for h in old.hosts}
        new = tuple(h for h in config.hosts if config.endpoint(h) not in known)
        if not new:
            continue
        provider = ssh_provider(
            name, config.model_copy(update={"hosts": new}), MemoryHostKeyStore()
        )
        provider.start_agents = False
        try:
            refused += await claimed_hosts(provider, name, lineage, claimant)
        finally:
            await provider.close()
    if refused:
        raise PlanError("\n".join(refused))
