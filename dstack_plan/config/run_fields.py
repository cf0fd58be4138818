"""Field types of run configurations: ports, mounts, repos, files, registry credentials."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from dstack_plan.config.base import Described, Shorthand, Strict

_PORT_RE = re.compile(r"^(?:(\*|\d+):)?(\d+)$")


def _port_number(value: int, what: str) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"{what} {value} is out of range 1-65535")
    return value


class PortMapping(Strict):
    """`8080`, `"80:8080"`, `"*:8080"` (random local port) or `{local_port, container_port}`."""

    _described: ClassVar[Described] = Described(
        'a port such as 8080 or "8080:80"', 'ports such as 8080 or "8080:80"'
    )

    local_port: int | None = None
    """Local port forwarded while attached; None means random (`*`)."""
    container_port: int

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a port must be a number or 'LOCAL:CONTAINER'")
        if isinstance(value, int):
            return {"local_port": value, "container_port": value}
        if isinstance(value, str):
            match = _PORT_RE.match(value.replace(" ", ""))
            if not match:
                raise ValueError(
                    f"invalid port mapping {value!r}: "
                    "expected PORT, LOCAL:CONTAINER or *:CONTAINER"
                )
            local, container = match.groups()
            if local is None:
                local = container
            return {
                "local_port": None if local == "*" else int(local),
                "container_port": int(container),
            }
        return value

    @field_validator("local_port", "container_port")
    @classmethod
    def _range(cls, value: int | None) -> int | None:
        return None if value is None else _port_number(value, "port")


PortSpec = Annotated[
    PortMapping,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 65535},
                {"type": "string", "pattern": r"^\s*(\*|\d+)?\s*:?\s*\d+\s*$"},
                {
                    "type": "object",
                    "properties": {
                        "local_port": {"type": ["integer", "null"]},
                        "container_port": {"type": "integer"},
                    },
                    "required": ["container_port"],
                    "additionalProperties": False,
                },
            ]
        }
    ),
]


class NetworkVolumeMount(Strict):
    """A network volume (declared as `type: volume`) mounted at `path`."""

    name: str | tuple[str, ...]
    """Volume name, or a list: one per node/job (`data-${{ dstack.node_rank }}` also works)."""
    path: str


class InstanceVolumeMount(Strict):
    """A directory of the host mounted into the container."""

    instance_path: str
    path: str
    optional: bool = False


_MOUNT_FORMS = "NAME:/path or /host/path:/path"


def _mount_shorthand(value: Any) -> Any:
    if isinstance(value, str):
        source, colon, target = value.partition(":")
        if not colon or not source or not target:
            raise ValueError(f"invalid volume {value!r}: expected {_MOUNT_FORMS}")
        if ":" in target:
            # `/a:/b:/c` is no mount Docker could make: which colon separates what?
            raise ValueError(
                f"invalid volume {value!r}: expected {_MOUNT_FORMS} (one ':', not "
                f"{value.count(':')})"
            )
        if "/" in source:
            return InstanceVolumeMount(instance_path=source, path=target)
        return NetworkVolumeMount(name=source, path=target)
    if isinstance(value, dict) and "instance_path" in value:
        return InstanceVolumeMount.model_validate(value)
    if isinstance(value, dict):
        return NetworkVolumeMount.model_validate(value)
    return value


VolumeMount = Annotated[
    NetworkVolumeMount | InstanceVolumeMount,
    BeforeValidator(_mount_shorthand),
    Described(
        'a volume such as "name:/path", "/host/path:/path" or {name, path}',
        'volumes such as "name:/path" or "/host/path:/path"',
    ),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": "^[^:]+:.+$"},
                {
                    "type": "object",
                    "properties": {
                        "name": {"anyOf": [{"type": "string"}, {"type": "array"}]},
                        "path": {"type": "string"},
                    },
                    "required": ["name", "path"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "instance_path": {"type": "string"},
                        "path": {"type": "string"},
                        "optional": {"type": "boolean"},
                    },
                    "required": ["instance_path", "path"],
                    "additionalProperties": False,
                },
            ]
        }
    ),
]


class Repo(Shorthand):
    shorthand_schema = ({"type": "string"},)
    _described: ClassVar[Described] = Described(
        "a repo: a local path, a git URL or {local_path or url, path}",
        "repos (local paths, git URLs or mappings)",
    )
    local_path: str | None = None
    url: str | None = None
    branch: str | None = None
    hash: str | None = None
    path: str = "."
    if_exists: str = "error"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        is_url = "://" in value or value.startswith("git@")
        if is_url:
            # a URL's own colons (scheme, scp-style host) are not a path separator
            base, sep, path = value.rpartition(":") if value.count(":") > 1 else (value, "", "")
            if sep and (path.startswith("/") or path.startswith(".")) and "://" in base:
                return {"url": base, "path": path}
            return {"url": value}
        local, sep, path = value.partition(":")
        return {"local_path": local, "path": path} if sep else {"local_path": local}

    @model_validator(mode="after")
    def _one_source(self) -> Repo:
        if (self.local_path is None) == (self.url is None):
            raise ValueError("a repo needs exactly one of local_path or url")
        if self.if_exists not in ("error", "skip"):
            raise ValueError("if_exists must be 'error' or 'skip'")
        return self


RepoSpec = Repo


class FileMapping(Shorthand):
    shorthand_schema = ({"type": "string"},)
    _described: ClassVar[Described] = Described(
        'a file such as "local/path:/container/path" or {local_path, path}',
        'files such as "local/path:/container/path"',
    )
    local_path: str
    path: str

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            local, sep, path = value.partition(":")
            return {"local_path": local, "path": path if sep else local}
        return value


FileSpec = FileMapping


class RegistryAuth(Strict):
    """Registry credentials; use `${{ secrets.X }}` so the password never lands in state."""

    username: str
    password: str


Priority = Annotated[int, Field(ge=0, le=100)]
