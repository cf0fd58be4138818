"""Kinds whose provider is not available in this version: planning works, applying says so."""

from __future__ import annotations

from dstack_plan.apply.handlers import ApplyContext, Outcome, ResourceHandler
from dstack_plan.errors import ProviderError
from dstack_plan.plan.model import ResourceChange
from dstack_plan.state.model import ResourceState


class UnsupportedHandler(ResourceHandler):
    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        raise ProviderError(
            change.provider, f"creating {change.kind}s is not supported yet", change.address
        )

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        raise ProviderError(
            change.provider, f"updating {change.kind}s is not supported yet", change.address
        )

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        # Nothing of this kind can have been created by this version; drop the record.
        return None
