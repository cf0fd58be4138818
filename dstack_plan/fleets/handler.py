"""The `fleet` handler: SSH fleets (`ssh_config`) and cloud fleets (`nodes`), each to its own.

Which one is decided by the fleet itself: the change's desired spec for a create or update,
the recorded entry for a refresh or delete (a fleet changing kind is replaced, so both
handlers see only their own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.fleets.records import is_cloud_fleet
from dstack_plan.fleets.ssh import FleetHandler
from dstack_plan.plan.model import MachineOffer, ResourceChange
from dstack_plan.providers.names import SSH
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.fleets.cloud import CloudFleetHandler


class FleetKinds(ResourceHandler):
    def __init__(self, ssh: FleetHandler, cloud: Callable[[], CloudFleetHandler]):
        self.ssh = ssh
        self._make_cloud = cloud
        """Builds the cloud fleets' handler: only projects with cloud fleets load it."""
        self._cloud: CloudFleetHandler | None = None

    @property
    def cloud(self) -> CloudFleetHandler:
        if self._cloud is None:
            self._cloud = self._make_cloud()
        return self._cloud

    def _for_change(self, change: ResourceChange) -> ResourceHandler:
        spec = change.after or {}
        return self.ssh if isinstance(spec.get("ssh_config"), dict) else self.cloud

    def _for_entry(self, current: ResourceState) -> ResourceHandler:
        return self.cloud if is_cloud_fleet(current) else self.ssh

    def cannot_create(self, kind: str, provider: str) -> str | None:
        handler = self.ssh if provider == SSH else self.cloud
        return handler.cannot_create(kind, provider)

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        return await self._for_change(change).create(change, ctx)

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        return await self._for_change(change).update(change, current, ctx)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        return await self._for_entry(current).refresh(current, ctx)

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        await self._for_entry(current).delete(current, ctx)

    async def grow(
        self, fleet: str, planned: MachineOffer, run: RunSpec, ctx: ApplyContext
    ) -> State:
        """Add machines to a cloud fleet for a run bursting to it (`CloudFleetHandler.grow`)."""
        return await self.cloud.grow(fleet, planned, run, ctx)
