"""Field types specific to services: replicas, scaling, probes, model, rate limits."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
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

from dstack_plan.config.base import (
    Described,
    FieldConflict,
    ItemError,
    Shorthand,
    Strict,
    is_stored,
)
from dstack_plan.config.python_version import PythonVersion
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
    null_kept: ClassVar[frozenset[str]] = frozenset({"scale_up_delay", "scale_down_delay"})

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, value: Any) -> Any:
        return {"30s": 30, "60s": 60, "1m": 60, "300s": 300, "5m": 300}.get(value, value)


_GROUP_NAME = r"^[a-z0-9][a-z0-9-]{0,39}$"
_GROUP_NAME_RE = re.compile(_GROUP_NAME)


def _group_name(value: str) -> str:
    if not _GROUP_NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid group name {value!r}: use 1-40 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    return value


GroupName = Annotated[
    str,
    AfterValidator(_group_name),
    WithJsonSchema({"type": "string", "pattern": _GROUP_NAME}),
]
"""The name of a replica or node group; unnamed groups are named by position ('0', '1', ...)."""


def group_names(groups: Sequence[Any]) -> list[str]:
    """Each group's name, as dstack fills it in: an unnamed group is named by its position."""
    return [str(i) if g.name is None else g.name for i, g in enumerate(groups)]


def check_unique_group_names(groups: Sequence[Any], key: str, what: str) -> None:
    """Refuse two groups with one name, counting the position names of unnamed groups."""
    first: dict[str, int] = {}
    for index, name in enumerate(group_names(groups)):
        if name in first:
            # an unnamed group has no `name` key to point at: point at the group
            where = (key, index) if groups[index].name is None else (key, index, "name")
            hint = "" if groups[index].name else " (an unnamed group is named by its position)"
            raise ItemError(f"{what} name {name!r} is used twice{hint}", where)
        first[name] = index


class Router(Strict):
    type: Literal["sglang", "dynamo"]


class ReplicaGroup(Strict):
    """A replica group of a service; fields set here may not also be set on the service."""

    _described: ClassVar[Described] = Described(
        "a replica group {name, replicas, commands, ...}", "replica groups (mappings)"
    )

    name: GroupName | None = None
    replicas: Replicas | None = None
    """Required, or its alias `count` (when both are set, `replicas` wins, as in dstack)."""
    count: Replicas | None = None
    scaling: Scaling | None = None
    resources: ResourcesSpec | None = None
    spot_policy: Literal["spot", "on-demand", "auto"] | None = None
    reservation: str | None = None
    commands: tuple[str, ...] | None = None
    image: str | None = None
    python: PythonVersion | None = None
    nvcc: bool | None = None
    docker: bool | None = None
    privileged: bool | None = None
    router: Router | None = None

    # dstack refuses these as null in a group (unlike on the service, where null is "not set")
    null_kept: ClassVar[frozenset[str]] = frozenset({"replicas", "resources", "commands"})

    @field_validator("replicas", "resources", "commands", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("must not be null in a replica group (leave the key out instead)")
        return value

    def replica_count(self) -> CountRange | None:
        """The group's replicas: `replicas`, else its alias `count`."""
        return self.replicas if self.replicas is not None else self.count

    @model_validator(mode="after")
    def _one_count(self, info: ValidationInfo) -> ReplicaGroup:
        replicas = self.replica_count()
        if is_stored(info):
            return self
        if replicas is None:
            raise ValueError("a replica group needs 'replicas' (or its alias 'count')")
        if self.router is not None and replicas != CountRange(min=1, max=1):
            raise ValueError("a router group must have exactly 1 replica")
        if replicas.min != replicas.max and self.scaling is None:
            raise FieldConflict("a replicas range needs 'scaling'", "replicas", "count")
        if replicas.min == replicas.max and self.scaling is not None:
            raise FieldConflict("'scaling' needs a replicas range such as 0..4", "scaling")
        return self

    @model_validator(mode="after")
    def _one_image_source(self, info: ValidationInfo) -> ReplicaGroup:
        if is_stored(info):
            return self
        if self.image is not None and self.python is not None:
            raise FieldConflict(
                "'image' and 'python' are mutually exclusive within a replica group", "python"
            )
        if self.docker:
            other = next((f for f in ("image", "python", "nvcc") if getattr(self, f)), None)
            if other is not None:
                raise FieldConflict(
                    f"'docker: true' and '{other}' are mutually exclusive within a replica group",
                    "docker",
                )
            if self.privileged is False:
                # docker-in-docker needs a privileged container
                raise FieldConflict(
                    "'privileged: false' conflicts with 'docker: true' (docker-in-docker runs "
                    "privileged)",
                    "privileged",
                )
        return self


# an image source on the service excludes these other image sources in a group
_EXCLUDED_IN_GROUPS: dict[str, tuple[str, ...]] = {
    "image": ("docker", "python", "nvcc"),
    "docker": ("image", "python", "nvcc"),
    "python": ("image", "docker"),
    "nvcc": ("image", "docker"),
}


def check_replica_groups(
    groups: Sequence[ReplicaGroup], key: str, service_sets: Collection[str], image: bool
) -> None:
    """Rules between a service and its replica groups (`key` is where the groups are written).

    `service_sets`: which of the fields that may be set on the service or in its groups, never
    in both (`image`, `docker`, `privileged`, `python`, `nvcc`, `spot_policy`, `reservation`),
    the service sets (`docker`, `privileged`, `nvcc` count only when true); `image`: whether
    the service has an image.
    """
    check_unique_group_names(groups, key, "replica group")
    names = group_names(groups)
    for index, group in enumerate(groups):
        for field in service_sets:
            for other in (field, *_EXCLUDED_IN_GROUPS.get(field, ())):
                if getattr(group, other) is None:
                    continue
                if other == field:
                    message = (
                        f"'{field}' is set both on the service and in replica group "
                        f"{names[index]!r}: set it in one place (on the service for all "
                        "groups, or per group)"
                    )
                else:
                    message = (
                        f"the service's '{field}' conflicts with '{other}' in replica group "
                        f"{names[index]!r}: image sources are mutually exclusive"
                    )
                raise ItemError(message, (key, index, other))
        if not group.commands and group.image is None and not image:
            raise ItemError(
                f"replica group {names[index]!r} needs 'commands' or an 'image' "
                "(in the group or on the service)",
                (key, index),
            )
    routers = [i for i, g in enumerate(groups) if g.router is not None]
    if len(routers) > 1:
        raise ItemError("at most one replica group may set 'router'", (key, routers[1], "router"))


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
    null_kept: ClassVar[frozenset[str]] = frozenset({"headers"})  # dstack refuses null

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
    null_kept: ClassVar[frozenset[str]] = frozenset({"prefix"})  # dstack refuses null
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
    null_kept: ClassVar[frozenset[str]] = frozenset({"prefix", "key", "burst"})
