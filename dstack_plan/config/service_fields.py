"""Field types specific to services: replicas, scaling, probes, model, rate limits."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from dstack_plan.config.base import Described, Shorthand, Strict
from dstack_plan.config.ranges import CountRange
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.units import Duration


def _replicas_range(value: Any) -> Any:
    # dstack: a range with no lower bound scales to zero; an upper bound is required
    rng = value if isinstance(value, CountRange) else CountRange.model_validate(value)
    if rng.max is None:
        raise ValueError("replicas needs an upper bound (e.g. 0..4)")
    low = 0 if rng.min is None else rng.min
    if low < 0:
        raise ValueError("replicas must not be negative")
    return {"min": low, "max": rng.max}


Replicas = Annotated[CountRange, BeforeValidator(_replicas_range)]


class Scaling(Strict):
    metric: Literal["rps"] = "rps"
    target: float = Field(gt=0)
    window: Literal[30, 60, 300] = 60
    scale_up_delay: Duration = 300
    scale_down_delay: Duration = 600

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, value: Any) -> Any:
        return {"30s": 30, "60s": 60, "1m": 60, "300s": 300, "5m": 300}.get(value, value)


class Router(Strict):
    type: Literal["sglang", "dynamo"]


class ReplicaGroup(Strict):
    """A replica group of a service; fields set here may not also be set on the service."""

    _described: ClassVar[Described] = Described(
        "a replica group {name, replicas, commands, ...}", "replica groups (mappings)"
    )

    name: str | None = None
    replicas: Replicas | None = None
    count: Replicas | None = None
    scaling: Scaling | None = None
    resources: ResourcesSpec | None = None
    spot_policy: Literal["spot", "on-demand", "auto"] | None = None
    reservation: str | None = None
    commands: tuple[str, ...] | None = None
    image: str | None = None
    python: str | None = None
    nvcc: bool | None = None
    docker: bool | None = None
    privileged: bool | None = None
    router: Router | None = None

    @model_validator(mode="after")
    def _one_count(self) -> ReplicaGroup:
        if self.replicas is not None and self.count is not None:
            raise ValueError("'replicas' and its alias 'count' are mutually exclusive")
        replicas = self.replicas or self.count
        if (
            self.router is not None
            and replicas is not None
            and replicas != CountRange(min=1, max=1)
        ):
            raise ValueError("a router group must have exactly 1 replica")
        return self


class Probe(Strict):
    _described: ClassVar[Described] = Described(
        "a probe {type, url, method, ...}", "probes (mappings)"
    )
    type: Literal["http"] = "http"
    url: str = "/"
    method: Literal["get", "post", "put", "delete", "patch", "head"] = "get"
    headers: tuple[dict[str, str], ...] = Field(default=(), max_length=16)
    body: str | None = None
    timeout: Duration = 10
    interval: Duration = 15
    ready_after: int = Field(default=1, ge=1)
    until_ready: bool = False

    @field_validator("timeout", "interval")
    @classmethod
    def _at_least_1s(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1s")
        return value


class ChatModel(Shorthand):
    shorthand_schema = ({"type": "string"},)
    type: Literal["chat"] = "chat"
    name: str
    format: Literal["openai", "tgi"] = "openai"
    prefix: str = "/v1"
    chat_template: str | None = None
    eos_token: str | None = None


def _model_shorthand(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


ModelSpec = Annotated[
    ChatModel,
    BeforeValidator(_model_shorthand),
    Described("a model name or {name, format, prefix, ...}"),
]


class RateLimitKey(Strict):
    type: Literal["ip_address", "header"] = "ip_address"
    header: str | None = None


class RateLimit(Strict):
    _described: ClassVar[Described] = Described(
        "a rate limit {prefix, key, rps, burst}", "rate limits (mappings)"
    )
    prefix: str = "/"
    key: RateLimitKey = RateLimitKey()
    rps: float = Field(ge=1 / 60)
    burst: int = Field(default=0, ge=0)
