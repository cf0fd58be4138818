"""Run kinds: `task`, `service`, `dev-environment`."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dstack_plan.config.base import (
    Described,
    FieldConflict,
    ItemError,
    ResourceName,
    ResourceSpec,
    Strict,
    is_stored,
)
from dstack_plan.config.env import Env
from dstack_plan.config.labels import Near, RunLabels
from dstack_plan.config.profile import EntityRef, ProfileParams
from dstack_plan.config.python_version import PythonVersion
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
    GroupName,
    ModelSpec,
    Probe,
    RateLimit,
    ReplicaGroup,
    Replicas,
    Scaling,
    check_replica_groups,
    check_unique_group_names,
    group_names,
)
from dstack_plan.config.units import OffableDuration

_SHELL_RE = re.compile(r"^(sh|bash|/\S+)$")
_WINDSURF_VERSION_RE = re.compile(r"^.+@[a-f0-9]+$")


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
    labels: RunLabels | None = None
    """Extension: host labels every job's host must carry (`config/labels.py`)."""
    near: Near | None = None
    """Extension: prefer hosts labelled `near` this storage (a preference, not a requirement)."""
    namespace: ResourceName | None = None
    """Extension: the namespace whose quotas the run counts against (`.dstack/quotas.yml`);
    unset means `default`, and so does `default` (kept out of the normalised spec)."""
    preemptible: bool | None = None
    """Extension: a waiting run of the same project with a higher `priority` may preempt
    this one's jobs (`watch/priority_preemption.py`); unset and `false` are the same (kept
    out of the normalised spec): never preempted for a priority."""

    # dstack's parser reads null as "not set" only where its own field is optional
    null_kept: ClassVar[frozenset[str]] = frozenset(
        {"privileged", "home_dir", "env", "resources", "volumes", "repos", "files", "dstack"}
        | {"setup"}
    )

    @field_validator("preemptible")
    @classmethod
    def _not_preemptible(cls, value: bool | None) -> bool | None:
        # `preemptible: false` is what leaving it out means: the same spec, no diff
        return value or None

    @field_validator("namespace")
    @classmethod
    def _default_namespace(cls, value: str | None) -> str | None:
        # `namespace: default` is what leaving it out means: the same spec, no diff
        return None if value == "default" else value

    @field_validator("home_dir", mode="before")
    @classmethod
    def _home_dir_not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("home_dir must be a string, not null")
        return value

    @field_validator("shell")
    @classmethod
    def _shell(cls, value: str | None) -> str | None:
        if value is not None and not _SHELL_RE.fullmatch(value):
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


class NodeGroup(Strict):
    """A group of a heterogeneous multi-node task."""

    _described: ClassVar[Described] = Described(
        "a node group {name, nodes, resources, commands, ports}", "node groups (mappings)"
    )

    name: GroupName | None = None
    nodes: int = Field(default=1, ge=1)
    resources: ResourcesSpec = ResourcesSpec()
    commands: tuple[str, ...] = ()
    ports: tuple[PortSpec, ...] = ()

    null_kept: ClassVar[frozenset[str]] = frozenset({"nodes", "resources", "commands", "ports"})


class TaskSpec(RunSpec):
    type: Literal["task"] = "task"
    entrypoint: str | None = None
    commands: tuple[str, ...] = ()
    ports: tuple[PortSpec, ...] = ()
    nodes: int | None = Field(default=None, ge=1)
    """Homogeneous multi-node: needs a fleet with `placement: cluster`."""
    groups: tuple[NodeGroup, ...] | None = None

    null_kept: ClassVar[frozenset[str]] = RunSpec.null_kept | {"ports", "commands"}

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> TaskSpec:
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
            if not is_stored(info):
                self._check_groups(self.groups)
        elif not self.commands and not self.image:
            raise ValueError("a task needs 'commands' or an 'image'")
        return self

    def _check_groups(self, groups: tuple[NodeGroup, ...]) -> None:
        check_unique_group_names(groups, "groups", "node group")
        for index, name in enumerate(group_names(groups)):
            if not groups[index].commands and self.image is None:
                raise ItemError(
                    f"node group {name!r} needs 'commands' (or an 'image' on the task)",
                    ("groups", index),
                )

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
    gateway: bool | EntityRef | None = None
    """Unset: the default gateway if any; false: none; true: the default is required; or a
    name (`project/name` or {project, name} for another project's)."""
    https: bool | Literal["auto"] = True
    auth: bool = True
    strip_prefix: bool = True
    model: ModelSpec | None = None
    probes: tuple[Probe, ...] | None = None
    rate_limits: tuple[RateLimit, ...] = ()

    null_kept: ClassVar[frozenset[str]] = RunSpec.null_kept | {
        "commands",
        "strip_prefix",
        "auth",
        "rate_limits",
    }

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> ServiceSpec:
        replicas = self.replicas
        # a normalised spec writes the default `replicas` out: only a user's own counts
        explicit = "replicas" in self.model_fields_set and not is_stored(info)
        if isinstance(replicas, tuple):
            if self.groups is not None:
                raise FieldConflict(
                    "use either 'groups' or a list in 'replicas', not both", "groups"
                )
        elif self.groups is not None and explicit:
            raise FieldConflict(
                "'replicas' and 'groups' are mutually exclusive: set replicas per group",
                "replicas",
            )
        elif replicas.min != replicas.max and self.scaling is None:
            raise FieldConflict("a replicas range needs 'scaling'", "replicas")
        elif explicit and replicas.min == replicas.max and self.scaling is not None:
            raise FieldConflict("'scaling' needs a replicas range such as 0..4", "scaling")
        if not is_stored(info):
            self._check_groups()
        if not self.groups and not isinstance(replicas, tuple):
            if not self.commands and not self.image:
                raise ValueError("a service needs 'commands' or an 'image'")
        prefixes = [r.prefix for r in self.rate_limits]
        if len(prefixes) != len(set(prefixes)):
            raise FieldConflict("rate_limits prefixes must be unique", "rate_limits")
        return self

    def _check_groups(self) -> None:
        key = "replicas" if isinstance(self.replicas, tuple) else "groups"
        if key == "groups" and self.groups is None:
            return
        groups = self.replica_groups()
        if not groups:
            raise FieldConflict(f"'{key}' must not be an empty list of groups", key)
        if self.scaling is not None:
            raise FieldConflict("with replica groups, set 'scaling' per group", "scaling")
        if self.commands:
            raise FieldConflict("with replica groups, set 'commands' per group", "commands")
        # dstack counts `docker`, `privileged` and `nvcc` as set on the service only when true
        service_sets = [
            name
            for name, value in (
                ("image", self.image is not None),
                ("docker", self.docker),
                ("privileged", self.privileged),
                ("python", self.python is not None),
                ("nvcc", self.nvcc),
                ("spot_policy", "spot_policy" in self.model_fields_set),
                ("reservation", self.reservation is not None),
            )
            if value
        ]
        check_replica_groups(groups, key, service_sets, self.image is not None)

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
    # dstack reads it as an offable duration (a negative one is an error), not an idle one
    inactivity_duration: OffableDuration = None

    null_kept: ClassVar[frozenset[str]] = RunSpec.null_kept | {"init", "ports"}

    @model_validator(mode="after")
    def _ide_version(self, info: ValidationInfo) -> DevEnvironmentSpec:
        if not self.version or is_stored(info):
            return self
        if self.ide is None:
            raise FieldConflict("'version' needs 'ide' to be set", "version")
        if self.ide == "windsurf" and not _WINDSURF_VERSION_RE.fullmatch(self.version):
            raise ItemError(
                f"invalid Windsurf version {self.version!r}: expected VERSION@COMMIT "
                "(e.g. 1.106.0@8951cd3ad688e789573d7f51750d67ae4a0bea7d)",
                "version",
            )
        return self

    @model_validator(mode="after")
    def _inactivity(self) -> DevEnvironmentSpec:
        if self.inactivity_duration not in (None, "off") and self.dstack:
            raise FieldConflict(
                "'inactivity_duration' is incompatible with 'dstack: true'", "inactivity_duration"
            )
        return self
