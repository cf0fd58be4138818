"""Run kinds: `task`, `service`, `dev-environment`."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from dstack_plan.config.base import Described, FieldConflict, ResourceName, ResourceSpec, Strict
from dstack_plan.config.env import Env
from dstack_plan.config.profile import ProfileParams
from dstack_plan.config.ranges import CountRange
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.run_fields import (
    FileSpec,
    PortSpec,
    Priority,
    RegistryAuth,
    RepoSpec,
    VolumeMount,
)
from dstack_plan.config.service_fields import (
    ModelSpec,
    Probe,
    RateLimit,
    ReplicaGroup,
    Replicas,
    Scaling,
)
from dstack_plan.config.units import IdleDuration

_PYTHON_VERSIONS = ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14")
_SHELL_RE = re.compile(r"^(sh|bash|/\S+)$")


def _python_version(value: Any) -> Any:
    if isinstance(value, float):
        # YAML reads `3.10` as the float 3.1
        major, minor = f"{value}".split(".")
        value = f"{major}.{minor}0" if minor == "1" else f"{major}.{minor}"
    if isinstance(value, str) and value not in _PYTHON_VERSIONS:
        raise ValueError(
            f"unsupported python {value!r}: choose one of {', '.join(_PYTHON_VERSIONS)}"
        )
    return value


PythonVersion = Annotated[
    Literal["3.9", "3.10", "3.11", "3.12", "3.13", "3.14"],
    BeforeValidator(_python_version),
    WithJsonSchema({"anyOf": [{"enum": list(_PYTHON_VERSIONS)}, {"type": "number"}]}),
]


class RunSpec(ResourceSpec, ProfileParams):
    """Fields shared by every run kind."""

    image: str | None = None
    python: PythonVersion | None = None
    nvcc: bool = False
    docker: bool = False
    """Docker-in-Docker: implies privileged."""
    privileged: bool = False
    user: str | None = None
    working_dir: str | None = None
    shell: str | None = None
    registry_auth: RegistryAuth | None = None
    env: Env = {}
    resources: ResourcesSpec = ResourcesSpec()
    priority: Priority = 0
    volumes: tuple[VolumeMount, ...] = ()
    repos: tuple[RepoSpec, ...] = Field(default=(), max_length=1)
    files: tuple[FileSpec, ...] = ()
    dstack: bool = False
    single_branch: bool | None = None
    setup: tuple[str, ...] = ()
    """Deprecated: use `commands` / `init`."""
    home_dir: str | None = None
    """Deprecated."""

    @field_validator("shell")
    @classmethod
    def _shell(cls, value: str | None) -> str | None:
        if value is not None and not _SHELL_RE.match(value):
            raise ValueError("shell must be 'sh', 'bash' or an absolute path")
        return value

    @field_validator("working_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("/", "~")):
            raise ValueError("working_dir must be an absolute path")
        return value

    @model_validator(mode="after")
    def _image_exclusions(self) -> RunSpec:
        if self.python is not None and self.image is not None:
            raise FieldConflict("'python' and 'image' are mutually exclusive", "python")
        if self.docker and (self.image or self.python or self.nvcc):
            raise FieldConflict("'docker: true' excludes 'image', 'python' and 'nvcc'", "docker")
        return self


_GROUP_NAME = r"^[a-z0-9][a-z0-9-]{0,39}$"
_GROUP_NAME_RE = re.compile(_GROUP_NAME)


def _group_name(value: str) -> str:
    if not _GROUP_NAME_RE.match(value):
        raise ValueError(
            f"invalid group name {value!r}: use 1-40 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    return value


class NodeGroup(Strict):
    """A group of a heterogeneous multi-node task."""

    _described: ClassVar[Described] = Described(
        "a node group {name, nodes, resources, commands, ports}", "node groups (mappings)"
    )

    name: (
        Annotated[
            str,
            AfterValidator(_group_name),
            WithJsonSchema({"type": "string", "pattern": _GROUP_NAME}),
        ]
        | None
    ) = None
    nodes: int = Field(default=1, ge=1)
    resources: ResourcesSpec = ResourcesSpec()
    commands: tuple[str, ...] = ()
    ports: tuple[PortSpec, ...] = ()


class TaskSpec(RunSpec):
    type: Literal["task"] = "task"
    entrypoint: str | None = None
    commands: tuple[str, ...] = ()
    ports: tuple[PortSpec, ...] = ()
    nodes: int | None = Field(default=None, ge=1)
    """Homogeneous multi-node: needs a fleet with `placement: cluster`."""
    groups: tuple[NodeGroup, ...] | None = None

    @model_validator(mode="after")
    def _shape(self) -> TaskSpec:
        if self.groups is not None:
            if self.nodes is not None:
                raise FieldConflict("'nodes' and 'groups' are mutually exclusive", "groups")
            if self.commands or self.ports or self.entrypoint:
                raise FieldConflict(
                    "with 'groups', set commands and ports per group",
                    "commands",
                    "ports",
                    "entrypoint",
                )
            if not self.groups:
                raise FieldConflict("'groups' must not be empty", "groups")
        elif not self.commands and not self.image:
            raise ValueError("a task needs 'commands' or an 'image'")
        return self

    def node_count(self) -> int:
        if self.groups:
            return sum(g.nodes for g in self.groups)
        return self.nodes or 1


class ServiceSpec(RunSpec):
    type: Literal["service"] = "service"
    entrypoint: str | None = None
    commands: tuple[str, ...] = ()
    port: PortSpec
    replicas: Replicas | tuple[ReplicaGroup, ...] = CountRange(min=1, max=1)
    """A count, a range (needs `scaling`), or legacy replica groups."""
    scaling: Scaling | None = None
    groups: tuple[ReplicaGroup, ...] | None = None
    gateway: bool | ResourceName | None = None
    """Unset: the default gateway if any; false: none; true: the default is required; or a name."""
    https: bool | Literal["auto"] = True
    auth: bool = True
    strip_prefix: bool = True
    model: ModelSpec | None = None
    probes: tuple[Probe, ...] | None = None
    rate_limits: tuple[RateLimit, ...] = ()

    @model_validator(mode="after")
    def _shape(self) -> ServiceSpec:
        replicas = self.replicas
        if isinstance(replicas, tuple):
            if self.groups is not None:
                raise FieldConflict(
                    "use either 'groups' or a list in 'replicas', not both", "groups"
                )
        elif replicas.min != replicas.max and self.scaling is None:
            raise FieldConflict("a replicas range needs 'scaling'", "replicas")
        if not self.groups and not isinstance(replicas, tuple):
            if not self.commands and not self.image:
                raise ValueError("a service needs 'commands' or an 'image'")
        prefixes = [r.prefix for r in self.rate_limits]
        if len(prefixes) != len(set(prefixes)):
            raise FieldConflict("rate_limits prefixes must be unique", "rate_limits")
        return self

    def replica_groups(self) -> tuple[ReplicaGroup, ...]:
        if isinstance(self.replicas, tuple):
            return self.replicas
        return self.groups or ()


class DevEnvironmentSpec(RunSpec):
    type: Literal["dev-environment"] = "dev-environment"
    ide: Literal["vscode", "cursor", "windsurf", "zed"] | None = None
    version: str | None = None
    init: tuple[str, ...] = ()
    ports: tuple[PortSpec, ...] = ()
    inactivity_duration: IdleDuration | None = None

    @model_validator(mode="after")
    def _inactivity(self) -> DevEnvironmentSpec:
        if self.inactivity_duration not in (None, "off") and self.dstack:
            raise FieldConflict(
                "'inactivity_duration' is incompatible with 'dstack: true'", "inactivity_duration"
            )
        return self
