"""What the SSH provider is told about who owns the hosts it provisions and terminates (the
apply layer decides: `fleets/claims.py`). Light: no SSH library is imported here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import HostClaim
    from dstack_plan.agent.client import AgentClient


@dataclass(frozen=True)
class OtherAgent:
    """An agent serving the host from another data dir than the fleet's (another login
    user's home, another `DSTACK_PLAN_SSH_AGENT_DIR`)."""

    pid: int
    user: str
    data_dir: str

    def describe(self) -> str:
        return f"pid {self.pid}, user {self.user}, data in {self.data_dir}"


@dataclass(frozen=True)
class HostOwners:
    """Who has the host, as read over SSH before its agent is touched: the claims its agent's
    data dir records, and other agents serving it."""

    claims: tuple[HostClaim, ...] = ()
    others: tuple[OtherAgent, ...] = ()


class Enrollment(Protocol):
    """What a fleet asks of each host it provisions: `before_install` sees who has the host
    before its agent is touched, and refuses it by raising DstackPlanError; `after_install`
    records the fleet's claim through the agent (the agent arbitrates a race) and raises the
    same way."""

    async def before_install(self, host: str, owners: HostOwners) -> None: ...

    async def after_install(self, host: str, agent: AgentClient) -> None: ...


@dataclass(frozen=True)
class Release:
    """The claim a terminate releases on each host: its owner's lineage and fleet address;
    `force` stops unfinished jobs left there instead of keeping the agent for them."""

    lineage: str
    fleet: str
    force: bool = False
