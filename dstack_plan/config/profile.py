"""Profile parameters: placement and policy fields shared by runs and fleets."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from dstack_plan.config.base import DEFERRED, Described, Shorthand, Strict
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
    def _five_fields(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("cron must not be empty")
        for expr in value:
            if len(expr.split()) != 5:
                raise ValueError(f"invalid cron expression {expr!r}: expected 5 fields")
        return value


class FleetRef(Strict):
    _described: ClassVar[Described] = Described(
        "a mapping {name, project}", "mappings {name, project}"
    )
    project: str | None = None
    name: str


class InstanceRef(Strict):
    _described: ClassVar[Described] = Described(
        "a mapping {name, hostname, fleet, instance}", "mappings {name, hostname, fleet, instance}"
    )
    name: str | None = None
    hostname: str | None = None
    fleet: str | None = None
    instance: int | str | None = None


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
    backend_options: tuple[dict[str, Any], ...] | None = None
    retry: RetrySpec = None
    idle_duration: IdleDuration | None = None

    @model_validator(mode="after")
    def _backend_options_have_type(self) -> PlacementParams:
        for option in self.backend_options or ():
            if "type" not in option:
                raise ValueError("each backend_options entry needs a 'type'")
        return self


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
    fleets: tuple[str | FleetRef, ...] | None = None
    """Fleets the run may use; unset means any declared fleet."""
    instances: tuple[str | InstanceRef, ...] | None = None

    def fleet_names(self) -> tuple[str, ...] | None:
        """Names of the fleets this run is restricted to, or None for "any" (also `fleets: []`,
        which restricts to nothing a run could use)."""
        if not self.fleets:
            return None
        return tuple(f if isinstance(f, str) else f.name for f in self.fleets)
