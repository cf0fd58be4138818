"""What the apply engine asks of each resource kind: make a planned change real.

One handler per kind (runs, fleets, volumes, gateways). Handlers do the side effects through
providers and agents; the engine decides order, parallelism and state commits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dstack_plan.clock import Clock, SystemClock
from dstack_plan.plan.model import Crash, ResourceChange
from dstack_plan.state.model import ResourceState, State


class Outcome(NamedTuple):
    """What a create or update produced, to be recorded in state."""

    status: str
    """e.g. `running`, `submitted`, `active`, `idle`."""
    attributes: dict[str, Any]
    """Provider facts: job ids, hosts, instance ids, price_per_hour (JSON data, no secrets)."""


class Refreshed(NamedTuple):
    """What refresh found out about a resource in state."""

    status: str
    attributes: dict[str, Any]
    gone: str | None = None
    """Why it no longer exists (drift), e.g. `jobs gone from the agent`; None if it exists."""
    crashed: Crash | None = None
    """It exists but broke by itself (a service whose jobs failed): drift the plan repairs."""
    short: str | None = None
    """It exists but has less than its spec asks (a cloud fleet that lost machines), e.g.
    `1 of 2 machines left`: drift the plan repairs by updating it in place."""


@dataclass
class ApplyContext:
    """Everything handlers may need besides the change itself."""

    project_dir: str = "."
    clock: Clock = field(default_factory=SystemClock)
    run_args: str = ""
    """Trailing CLI arguments, for `${{ run.args }}`."""
    progress: Callable[[str, str], None] = lambda address, message: None
    """Report progress of a long operation (address, message) to the user."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    replacement: ResourceState | None = None
    """When `delete` destroys a deposed object: the object that replaced it at the same
    address. Whatever belongs to it must survive the delete (create-before-destroy)."""
    force: bool = False
    """`apply --force`: drain SSH hosts that leave their fleet (stop the jobs on them)
    instead of refusing to remove them; `destroy --force`: forget what cannot be reached."""
    successor: Mapping[str, Any] | None = None
    """When `delete` runs for a delete-then-create: the spec that replaces the one deleted
    (a fleet whose create failed is reached with its corrected settings)."""
    state: Callable[[], State] | None = None
    """The newest state: during apply, what the walk last committed (a run reads the entry
    of the fleet created before it); during a refresh, the state being refreshed."""

    commit: Callable[[Callable[[State], State]], Awaitable[State]] | None = None
    """Commit a mutation of the stored state now, mid-operation, and get the state written
    (apply: so a long update, a rolling one, records each step); None where a handler must
    not write (refresh, watch: the loop commits what its actors return)."""

    def current_state(self) -> State:
        """`state()`, or an empty state when none was given (a handler used on its own)."""
        return self.state() if self.state is not None else State.empty()


class ResourceHandler(ABC):
    """Side effects for one kind. Every method must be safe to retry after a crash."""

    def cannot_create(self, kind: str, provider: str) -> str | None:
        """Why this handler cannot create or update a `kind` held by `provider`, or None when
        it can. The plan refuses such a resource instead of promising it; deleting one from
        state must still work."""
        return None

    @abstractmethod
    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        """Create what `change.after` describes; `change.placement` says where, if planned."""

    @abstractmethod
    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        """Update in place; only `change.changed_paths` differ from `current.spec`."""

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        """Ask the provider or agents what exists now; the default trusts the state."""
        return Refreshed(status=current.status, attributes=dict(current.attributes))

    async def refresh_many(
        self, currents: Sequence[ResourceState], ctx: ApplyContext
    ) -> dict[str, Refreshed]:
        """`refresh` for several entries, by address: what a plan of a whole state uses.

        The default asks `refresh` for each in turn. Handlers that can answer for many
        resources with one call (runs: one job listing per agent) override it.
        """
        return {current.address: await self.refresh(current, ctx) for current in currents}

    @abstractmethod
    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        """Delete what `current` records. Idempotent: a resource already gone is success.

        Also called for a *tainted* entry, whose create may have been cut short: it must clean
        up whatever the create could have started, even if `current.attributes` is incomplete.
        """
