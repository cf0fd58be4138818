"""What the SSH provider is told about who owns the hosts it provisions and terminates (the
apply layer decides: `apply/host_claims.py`). Light: no SSH library is imported here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import HostClaim
    from dstack_plan.agent.client import AgentClient


class Enrollment(Protocol):
    """What a fleet asks of each host it provisions: `before_install` sees the claims the
    host records before its agent is touched, and refuses it by raising DstackPlanError;
    `after_install` records the fleet's claim through the agent (the agent arbitrates a
    race) and raises the same way."""

    async def before_install(self, host: str, claims: list[HostClaim]) -> None: ...

    async def after_install(self, host: str, agent: AgentClient) -> None: ...


@dataclass(frozen=True)
class Release:
    """The claim a terminate releases on each host: its owner's lineage and fleet address;
    `force` stops unfinished jobs left there instead of keeping the agent for them."""

    lineage: str
    fleet: str
    force: bool = False
