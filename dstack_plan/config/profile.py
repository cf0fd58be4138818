"""Profile parameters: placement and policy fields shared by runs and fleets."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from dstack_plan.config.backend_options import BackendOptions, one_entry_per_backend
from dstack_plan.config.base import (
    DEFERRED,
    Described,
    FieldConflict,
    Shorthand,
    Strict,
    is_stored,
)
from dstack_plan.config.cron import check_cron
from dstack_plan.config.units import Duration, IdleDuration, OffableDuration

SpotPolicy = Literal["spot", "on-demand", "auto"]
RetryEvent = Literal["no-capacity", "interruption", "error"]
ALL_RETRY_EVENTS: tuple[RetryEvent, ...] = ("no-capacity", "interruption", "error")


class Retry(Shorthand):
    shorthand_schema = ({"type": "boolean"},)
    on_events: tuple[RetryEvent, ...] = ALL_RETRY_EVENTS
    """Events that trigger a retry; omitted means all three."""
    duration: Duration = 3600
    """How long to keep retrying: for no-capacity since submission, else since the last failure."""

    @field_validator("on_events")
    @classmethod
    def _non_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("on_events must not be empty (omit it to retry on all events)")
        return tuple(sorted(set(value), key=ALL_RETRY_EVENTS.index))


def _retry_shorthand(value: Any) -> Any:
    if value is True:
        return {}
    if value is False:
        return None
    return value


RetrySpec = Annotated[
    Retry | None,
    BeforeValidator(_retry_shorthand),
    Described("true, false or {on_events, duration}"),
]


class UtilizationPolicy(Strict):
    min_gpu_utilization: int = Field(ge=0, le=100)
    time_window: Duration

    @field_validator("time_window")
    @classmethod
    def _at_least_5m(cls, value: int) -> int:
        if value < 300:
            raise ValueError("time_window must be at least 5m")
        return value


def _cron_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class Schedule(Strict):
    cron: Annotated[
        tuple[str, ...],
        BeforeValidator(_cron_list),
        WithJsonSchema(
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
        ),
    ]
    """POSIX cron expressions in UTC (one or several)."""

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if not value:
            raise ValueError("cron must not be empty")
        if is_stored(info):
            return value  # checked when it was loaded
        for expr in value:
            check_cron(expr)
        return value


def _entity_reference(value: str) -> str:
    parts = value.split("/")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"invalid reference {value!r}: expected <name> or <project>/<name>")
    return value


EntityName = Annotated[
    str,
    AfterValidator(_entity_reference),
    Described("a name (or <project>/<name>)", "names (or <project>/<name>)"),
]
"""A reference to a fleet or gateway written as text: `name`, or `project/name` for one of
another project. Kept as written (the spec, and so its hash, stays what the user wrote)."""


class FleetRef(Strict):
    """A reference to a fleet or gateway written as a mapping; no `project` means this one."""

    _described: ClassVar[Described] = Described(
        "a mapping {name, project}", "mappings {name, project}"
    )
    project: str | None = None
    name: str


EntityRef = EntityName | FleetRef


def reference_parts(ref: str | FleetRef) -> tuple[str | None, str]:
    """(project or None for this project, name) of a reference in either form."""
    if isinstance(ref, FleetRef):
        return ref.project, ref.name
    project, slash, name = ref.rpartition("/")
    return (project if slash else None), name


def _non_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


NonEmpty = Annotated[
    str, AfterValidator(_non_empty), WithJsonSchema({"type": "string", "minLength": 1})
]


def _non_empty_list(value: Any) -> Any:
    # checked before the items: pydantic's min_length counts only the items that validated
    if isinstance(value, list | tuple) and not value:
        raise ValueError("must not be empty (omit it to allow any instance)")
    return value


class InstanceRef(Strict):
    """One instance selector: `{name}`, `{hostname}` or `{fleet, instance}` (dstack's three)."""

    _described: ClassVar[Described] = Described(
        "a mapping {name}, {hostname} or {fleet, instance}",
        "instance names or mappings {name}, {hostname} or {fleet, instance}",
    )
    name: NonEmpty | None = None
    hostname: NonEmpty | None = None
    fleet: EntityRef | None = None
    instance: int | None = Field(default=None, ge=0)
    """The instance number within `fleet`."""

    @model_validator(mode="after")
    def _one_form(self) -> InstanceRef:
        given = [f for f in ("name", "hostname", "fleet") if getattr(self, f) is not None]
        if len(given) > 1:
            raise FieldConflict(
                f"{' and '.join(repr(f) for f in given)} are mutually exclusive: an instance "
                "selector is {name}, {hostname} or {fleet, instance}",
                *given[1:],
            )
        if self.fleet is not None and self.instance is None:
            raise FieldConflict("'fleet' needs 'instance' (the instance number)", "fleet")
        if self.instance is not None and self.fleet is None:
            raise FieldConflict("'instance' needs 'fleet'", "instance")
        if not given:
            raise ValueError("an instance selector needs 'name', 'hostname' or 'fleet'")
        return self


class PlacementParams(Strict):
    """Where machines may come from; shared by fleets and runs."""

    model_config = DEFERRED

    backends: tuple[str, ...] | None = None
    regions: tuple[str, ...] | None = None
    availability_zones: tuple[str, ...] | None = None
    instance_types: tuple[str, ...] | None = None
    reservation: str | None = None
    spot_policy: SpotPolicy = "on-demand"
    max_price: float | None = Field(default=None, gt=0)
    """Highest acceptable price, in $ per hour."""
    tags: dict[str, str] | None = None
    backend_options: tuple[BackendOptions, ...] | None = None
    """One entry per backend; dstack defines options for `vastai` only."""
    retry: RetrySpec = None
    idle_duration: IdleDuration | None = None

    _backend_options = field_validator("backend_options")(one_entry_per_backend)


class ProfileParams(PlacementParams):
    """A run's policy knobs on top of placement; a run's values combine with its fleet's."""

    max_duration: OffableDuration = "off"
    """Longest a job may run (counting only the running state)."""
    stop_duration: OffableDuration = 300
    """Graceful-stop window before a job is killed."""
    creation_policy: Literal["reuse", "reuse-or-create"] = "reuse-or-create"
    utilization_policy: UtilizationPolicy | None = None
    startup_order: Literal["any", "master-first", "workers-first"] = "any"
    stop_criteria: Literal["all-done", "master-done"] = "all-done"
    schedule: Schedule | None = None
    fleets: tuple[EntityRef, ...] | None = None
    """Fleets the run may use; unset means any declared fleet."""
    instances: Annotated[
        tuple[NonEmpty | InstanceRef, ...] | None,
        BeforeValidator(_non_empty_list),
        Field(json_schema_extra={"minItems": 1}),
    ] = None
    """Existing instances the run may be placed on: names or selectors."""

    def fleet_names(self) -> tuple[str, ...] | None:
        """Names of this project's fleets the run is restricted to, or None for "any" (also
        `fleets: []`, which restricts to nothing a run could use). Fleets of other projects
        are left out: `placement_fleets` has them."""
        if not self.fleets:
            return None
        parts = (reference_parts(f) for f in self.fleets)
        return tuple(name for project, name in parts if project is None)

    def placement_fleets(self) -> tuple[str, ...]:
        """Every fleet the run names, in order: this project's by name, another project's
        as `project/name` (an imported fleet: `sharing/imports.py` resolves it)."""
        parts = (reference_parts(f) for f in self.fleets or ())
        return tuple(name if project is None else f"{project}/{name}" for project, name in parts)
