"""Kinds whose provider is not available in this version: the plan refuses to create them.

Deleting one still works (it only leaves state), so `destroy` and removing it from the
configuration clean up what an older version, or a failed create, recorded.
"""

from __future__ import annotations

from dstack_plan.apply.handlers import ApplyContext, Outcome, ResourceHandler
from dstack_plan.errors import ProviderError
from dstack_plan.plan.model import ResourceChange
from dstack_plan.state.model import ResourceState


class UnsupportedHandler(ResourceHandler):
    """A kind no provider of this version can create (fleets, volumes, gateways so far)."""

    def cannot_create(self, kind: str, provider: str) -> str | None:
        return f"the {provider} provider cannot create {kind}s in this version"

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        # the plan refuses these; a hand-made plan file could still ask
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
