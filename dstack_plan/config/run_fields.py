"""Field types of run configurations: ports, mounts, repos, files, registry credentials."""

from __future__ import annotations

import re
import string
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any, ClassVar

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from dstack_plan.config.base import Shorthand, Strict, is_stored
from dstack_plan.config.described import Described

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
            match = _PORT_RE.fullmatch(value.replace(" ", ""))
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


def _mount_path(value: str, info: ValidationInfo) -> str:
    """A mount's path (in the container or on the host): absolute, and without `..`."""
    if is_stored(info):
        return value
    what = "the instance path" if info.field_name == "instance_path" else "the container path"
    if not value:
        raise ValueError(f"{what} must not be empty")
    parts = PurePosixPath(value).parts
    if not parts or parts[0] != "/":
        raise ValueError(f"{what} must be absolute, got {value!r}")
    if ".." in parts:
        raise ValueError(f"{what} must not contain '..', got {value!r}")
    return value


class NetworkVolumeMount(Strict):
    """A network volume (declared as `type: volume`) mounted at `path`."""

    name: str | tuple[str, ...]
    """Volume name, or a list: one per node/job (`data-${{ dstack.node_rank }}` also works)."""
    path: str

    _path = field_validator("path")(_mount_path)

    @field_validator("name")
    @classmethod
    def _named(cls, value: str | tuple[str, ...], info: ValidationInfo) -> str | tuple[str, ...]:
        # dstack's parser lets "" through to fail in its server; we refuse it where it is written
        if not is_stored(info) and "" in ((value,) if isinstance(value, str) else value):
            raise ValueError("a volume name must not be empty")
        return value


class InstanceVolumeMount(Strict):
    """A directory of the host mounted into the container."""

    instance_path: str
    path: str
    optional: bool = False
    null_kept: ClassVar[frozenset[str]] = frozenset({"optional"})  # dstack refuses null

    _paths = field_validator("instance_path", "path")(_mount_path)


_MOUNT_FORMS = "NAME:/path or /host/path:/path"


def _mount_shorthand(value: Any, info: ValidationInfo) -> Any:
    # the mount's own validation runs here, with this validation's context (a stored spec)
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 2:
            # dstack takes no mode suffix (`name:/path:ro`): exactly one ':'
            raise ValueError(
                f"invalid volume {value!r}: expected {_MOUNT_FORMS} (one ':', not "
                f"{value.count(':')})"
            )
        source, target = parts
        if not source:
            raise ValueError(f"invalid volume {value!r}: expected {_MOUNT_FORMS}")
        if "/" in source:
            value = {"instance_path": source, "path": target}
        else:
            value = {"name": source, "path": target}
    if isinstance(value, dict) and "instance_path" in value:
        return InstanceVolumeMount.model_validate(value, context=info.context)
    if isinstance(value, dict):
        return NetworkVolumeMount.model_validate(value, context=info.context)
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
                {"type": "string", "pattern": "^[^:]+:[^:]*$"},
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


def _split_path_pair(value: str, what: str) -> list[str]:
    """`value` split at its ':'s, except the one of a Windows drive (`C:\\src`, `c:/src`)
    at its start; more than two parts is an error naming `what`."""
    parts = value.split(":")
    if _is_drive(parts):
        parts = [f"{parts[0]}:{parts[1]}", *parts[2:]]
    if len(parts) > 2:
        raise ValueError(
            f"invalid {what} {value!r}: expected LOCAL or LOCAL:PATH (one ':', besides a "
            "Windows drive letter)"
        )
    return parts


def _is_drive(parts: list[str]) -> bool:
    return (
        len(parts) > 1
        and len(parts[0]) == 1
        and parts[0] in string.ascii_letters
        and parts[1][:1] in ("\\", "/")
    )


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
    null_kept: ClassVar[frozenset[str]] = frozenset({"path", "if_exists"})  # dstack refuses null

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        # as dstack splits it: a URL's first ':' (`git@host:org/repo`, `https://host/...`)
        # belongs to the URL, like a Windows drive's to a local path
        parts = value.split(":")
        is_url = len(parts) > 1 and ("@" in parts[0] or parts[1].startswith("//"))
        if is_url:
            parts = [f"{parts[0]}:{parts[1]}", *parts[2:]]
            if len(parts) > 2:
                raise ValueError(f"invalid repo {value!r}: expected URL or URL:PATH")
        else:
            parts = _split_path_pair(value, "repo")
        source = {"url" if is_url else "local_path": parts[0]}
        return {**source, "path": parts[1]} if len(parts) == 2 else source

    @field_validator("path")
    @classmethod
    def _no_other_home(cls, value: str, info: ValidationInfo) -> str:
        if is_stored(info):
            return value
        if value.startswith("~") and PurePosixPath(value).parts[0] != "~":
            raise ValueError(f"'~user' paths are not supported, got {value!r} (use '~/...')")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Repo:
        # empty strings count as unset, as in dstack
        if bool(self.local_path) == bool(self.url):
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
            parts = _split_path_pair(value, "file mapping")
            return {"local_path": parts[0], "path": parts[-1]}
        return value

    @field_validator("path")
    @classmethod
    def _unix_path(cls, value: str, info: ValidationInfo) -> str:
        # the container runs Linux: `C:/data` there is a mistake for the local side
        if PureWindowsPath(value).is_absolute() and not is_stored(info):
            raise ValueError(
                f"the container path must be a Unix path, got {value!r} "
                "(a Windows path is for the local side: LOCAL:/container/path)"
            )
        return value


FileSpec = FileMapping


class RegistryAuth(Strict):
    """Registry credentials; use `${{ secrets.X }}` so the password never lands in state."""

    username: str
    password: str


Priority = Annotated[int, Field(ge=0, le=100)]
