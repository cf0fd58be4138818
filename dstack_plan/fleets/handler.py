"""The `fleet` handler: SSH fleets (`ssh_config`), cloud fleets (`nodes`) and engine fleets
(`backends: [slurm]`, `backends: [kubernetes]`), each to its own.

Which one is decided by the fleet itself: the change's desired spec for a create or update,
the recorded entry for a refresh or delete (a fleet changing kind is replaced, so both
handlers see only their own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.fleets.records import is_cloud_fleet, is_engine_fleet
from dstack_plan.fleets.ssh import FleetHandler
from dstack_plan.plan.model import MachineOffer, ResourceChange
from dstack_plan.providers.names import ENGINES, SSH
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.fleets.cloud import CloudFleetHandler


class FleetKinds(ResourceHandler):
    def __init__(
        self,
        ssh: FleetHandler,
        cloud: Callable[[], CloudFleetHandler],
        engine: Callable[[str], ResourceHandler],
    ):
        self.ssh = ssh
        self._make_cloud = cloud
        """Builds the cloud fleets' handler: only projects with cloud fleets load it."""
        self._cloud: CloudFleetHandler | None = None
        self._make_engine = engine
        """Builds an engine backend's fleet handler (Slurm's, Kubernetes'): only projects
        with such fleets load one."""
        self._engines: dict[str, ResourceHandler] = {}

    @property
    def cloud(self) -> CloudFleetHandler:
        if self._cloud is None:
            self._cloud = self._make_cloud()
        return self._cloud

    def engine(self, provider: str) -> ResourceHandler:
        """The fleet handler of engine backend `provider`."""
        if provider not in self._engines:
            self._engines[provider] = self._make_engine(provider)
        return self._engines[provider]

    def _for_change(self, change: ResourceChange) -> ResourceHandler:
        spec = change.after or {}
        if isinstance(spec.get("ssh_config"), dict):
            return self.ssh
        if change.provider in ENGINES:
            return self.engine(change.provider)
        return self.cloud

    def _for_entry(self, current: ResourceState) -> ResourceHandler:
        if is_engine_fleet(current):
            return self.engine(current.provider)
        return self.cloud if is_cloud_fleet(current) else self.ssh

    def cannot_create(self, kind: str, provider: str) -> str | None:
        if provider in ENGINES:
            return self.engine(provider).cannot_create(kind, provider)
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
