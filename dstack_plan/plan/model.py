"""The plan: what will change, why, where runs go and what it costs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from dstack_plan.plan.html_table import html_table

if TYPE_CHECKING:
    from dstack_plan.state.model import ResourceState

PLAN_FORMAT_VERSION = "1.0"

DEPOSED_KEY = "_deposed"
"""State attribute under which apply keeps old objects that a create-before-destroy replace
could not destroy yet; the next apply of that address destroys them."""

CREATING = "creating"
"""Status of an intent entry: apply started a create and has not recorded it as done. Such an
entry (tainted, without deposed objects) records nothing that was ever created."""


class Crash(NamedTuple):
    """Refresh found a long-running resource broken (a service or dev environment whose jobs
    failed, not stopped by the user): drift that the plan repairs by replacing it."""

    reason: str
    """e.g. `service crashed (job llm-0-0 exited with code 1)`."""
    active: bool = False
    """Some of its jobs still run: replacing it stops them too."""


class Action(str, Enum):
    CREATE = "create"
    UPDATE = "update"
    DELETE_THEN_CREATE = "delete-then-create"
    CREATE_THEN_DELETE = "create-then-delete"
    DELETE = "delete"
    NOOP = "no-op"

    @property
    def symbol(self) -> str:
        return _SYMBOLS[self]

    @property
    def is_replace(self) -> bool:
        return self in (Action.DELETE_THEN_CREATE, Action.CREATE_THEN_DELETE)

    @property
    def terraform_actions(self) -> list[str]:
        """The `change.actions` list of Terraform's JSON plan."""
        return {
            Action.CREATE: ["create"],
            Action.UPDATE: ["update"],
            Action.DELETE_THEN_CREATE: ["delete", "create"],
            Action.CREATE_THEN_DELETE: ["create", "delete"],
            Action.DELETE: ["delete"],
            Action.NOOP: ["no-op"],
        }[self]


_SYMBOLS = {
    Action.CREATE: "+",
    Action.UPDATE: "~",
    Action.DELETE_THEN_CREATE: "-/+",
    Action.CREATE_THEN_DELETE: "+/-",
    Action.DELETE: "-",
    Action.NOOP: " ",
}


class Frozen(BaseModel):
    # Validators are built on first use: `dstack plan` constructs its plan from values it
    # computed itself (`model_construct`); only placements and saved plans are validated.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class MachineOffer(Frozen):
    """The cloud offer a fleet's new machines are planned from (apply tries it first, then
    the next ones in price order when it has no capacity)."""

    provider: str
    instance_type: str
    region: str
    spot: bool = False
    price_per_hour: float
    """$ per hour for one machine."""
    count: int
    """Machines the change creates (a scale-down creates none: 0)."""
    zones: tuple[str, ...] | None = None
    """The zones they must be created in, in order (the fleet's `availability_zones`, or the
    zone of the volumes the run they are for mounts); None: any zone of the region."""


class Placement(Frozen):
    """Where a run's jobs will go, or a cloud fleet's machines come from, as far as the
    planner can tell."""

    fleet: str
    """Fleet name; `local` is the built-in fleet (this machine)."""
    provider: str
    hosts: tuple[str, ...] = ()
    """Hosts chosen for the jobs; empty when only known after apply."""
    price_per_hour: float = 0.0
    placed: bool | None = None
    """True: `hosts` can take the jobs; False: no host can (`note` says why), so applying it
    fails; None: machines are known only after apply."""
    pending: bool = False
    """Not placed now, only because what runs on the hosts holds the GPUs or ports it needs
    (`note` says what it waits for); False with `placed` False: no host could ever take it."""
    note: str | None = None
    """Why the placement is uncertain or impossible (e.g. no host has enough GPUs)."""
    estimated_start: float | None = None
    """A pending run's earliest start (epoch seconds) by the max_durations of what runs and
    the queue ahead; None: not pending, or not known (`note` says why)."""
    preempts: tuple[str, ...] = ()
    """The jobs the owner's watch would preempt for it (its project under its guarantee of
    an exported fleet), as `PROJECT: ADDRESS (JOB ID)`."""
    offer: MachineOffer | None = None
    """A cloud fleet's: what its new machines will be; `price_per_hour` is then the whole
    fleet's after the change."""


@dataclass(frozen=True, slots=True)
class ResourceChange:
    """One address's change. A plain dataclass: a large plan makes ten thousand of them from
    values already typed (state, normalised configuration, diff), at under half a model's
    cost. `Plan` still validates them when a saved plan is read back."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    address: str
    kind: str
    name: str
    provider: str
    action: Action
    reason: str | None = None
    """Human reason: `not in configuration`, `forces replacement: resources.gpu`, ..."""
    action_reason: str | None = None
    """Terraform's machine reason: `replace_because_cannot_update`, `replace_by_request`, ..."""
    before: dict[str, Any] | None = None
    """Normalised spec in state; None for a create."""
    after: dict[str, Any] | None = None
    """Normalised desired spec; None for a delete."""
    changed_paths: tuple[str, ...] = ()
    """Dotted field paths that differ between before and after."""
    replace_paths: tuple[str, ...] = ()
    """Changed paths that force replacement."""
    depends_on: tuple[str, ...] = ()
    """Addresses this resource depends on (desired edges, or state edges for a delete)."""
    placement: Placement | None = None
    secrets: tuple[str, ...] = ()
    """Names of the secrets the spec refers to (never values)."""
    submitted: bool | None = None
    """How apply records the entry: True as submitted (`apply -f`, the SDK), False as
    declared (a directory apply found it in the files); None: as it is recorded now."""

    @property
    def origin_only(self) -> bool:
        """A no-op whose only effect is recording a submitted resource as declared."""
        return self.action is Action.NOOP and self.submitted is not None

    @classmethod
    def in_place(cls, entry: ResourceState) -> ResourceChange:
        """An update of `entry` to the spec it already has: watch changing how it runs (a
        rollout step, a scale), not what is declared."""
        spec = dict(entry.spec)
        return cls(
            address=entry.address,
            kind=entry.kind,
            name=entry.name,
            provider=entry.provider,
            action=Action.UPDATE,
            before=spec,
            after=dict(spec),
        )


class Cost(Frozen):
    """Estimated hourly cost, in $ per hour."""

    before: float = 0.0
    after: float = 0.0


class Plan(Frozen):
    format_version: str = PLAN_FORMAT_VERSION
    lineage: str
    """Lineage of the state the plan was computed from ('' when the state did not exist)."""
    serial: int
    """Serial of that state; applying refuses a plan whose state has moved on."""
    destroy: bool = False
    targets: tuple[str, ...] = ()
    replace: tuple[str, ...] = ()
    changes: tuple[ResourceChange, ...] = ()
    cost: Cost = Field(default_factory=Cost)
    warnings: tuple[str, ...] = ()
    submission: bool = False
    """Planned for a submission (`-f` files, the SDK): it deletes nothing it was not given."""
    kept: tuple[str, ...] = ()
    """Submitted resources a directory plan keeps although its files do not declare them."""

    @property
    def has_changes(self) -> bool:
        return any(c.action is not Action.NOOP or c.origin_only for c in self.changes)

    def _repr_html_(self) -> str:
        """A notebook's view of the plan: one row per change (action, address, reason, where
        it goes), the summary as the caption."""
        rows = [
            (c.action.value, c.address, c.reason or "", c.placement.fleet if c.placement else "")
            for c in self.changes
        ]
        return html_table(("action", "address", "reason", "fleet"), rows, self.summary())

    def counts(self) -> tuple[int, int, int]:
        """(to add, to change, to destroy) as Terraform counts them: a replace is +1 and -1."""
        add = change = destroy = 0
        for c in self.changes:
            if c.action is Action.CREATE or c.action.is_replace:
                add += 1
            if c.action is Action.DELETE or c.action.is_replace:
                destroy += 1
            if c.action is Action.UPDATE:
                change += 1
        return add, change, destroy

    def summary(self) -> str:
        add, change, destroy = self.counts()
        return f"Plan: {add} to add, {change} to change, {destroy} to destroy."

    def change(self, address: str) -> ResourceChange | None:
        for c in self.changes:
            if c.address == address:
                return c
        return None
