"""The job spec a controller submits, validated field by field with messages a user can act on."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from dstack_plan.agent.image_ref import image_reference_error
from dstack_plan.agent.protocol import LABEL_PREFIX, REDACTED

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ENV_NAME = re.compile(r"[^=\x00-\x1f\x7f]{1,256}")
"""Any name a variable can have (`MY-VAR`, `spring.profiles.active`): Docker and execve(2)
pass them on; dstack's `env:` mapping takes them (dstack_plan.config.env checks the same)."""
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?")
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PUBLIC_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com"
    r"|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}(?: [\x20-\x7e]{1,256})?"
)
"""One OpenSSH public key line (`ssh-ed25519 AAAA... comment`): no options, no newline, so
it can go into an authorized_keys file as it is."""

ENV_VALUE_MAX = 64 * 1024
ENV_TOTAL_MAX = 1024 * 1024
COMMANDS_MAX = 120 * 1024
"""Linux caps one argv string (the joined `sh -c` script) at 128 KiB."""
PATH_MAX = 4096
MIN_MEMORY = 6 * 1024 * 1024
"""Docker refuses smaller memory limits; say so at submit time instead of at container start."""
MAX_GPUS = 1024
NETWORK_MODES = ("host", "bridge")


class SpecError(Exception):
    """One or more invalid fields; `problems` holds (field, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


@dataclass(frozen=True)
class PortSpec:
    container_port: int
    host_port: int | None = None


@dataclass(frozen=True)
class VolumeSpec:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DiskSpec:
    """A network disk the controller attached to this machine, mounted into the container."""

    name: str
    """The volume's name (what messages call it)."""
    devices: tuple[str, ...]
    """Where it may appear, most specific first (`/dev/disk/by-id/...`, then `/dev/sdf`)."""
    container_path: str
    read_only: bool = False


@dataclass(frozen=True)
class RegistryAuth:
    """Credentials for pulling the job's image from a private registry (never printed)."""

    username: str = field(repr=False)
    password: str = field(repr=False)

    def to_dict(self, redact: bool = True) -> dict[str, str]:
        """`{username, password}` (docker's `auth_config`), or the redaction marker for each."""
        if redact:
            return {"username": REDACTED, "password": REDACTED}
        return {"username": self.username, "password": self.password}


@dataclass(frozen=True)
class SSHAccess:
    """`ssh: {public_key}`: the agent starts an SSH server for the job (`job_sshd`) that lets
    the holder of this key in, reachable on the host's 127.0.0.1 only."""

    public_key: str

    def to_dict(self) -> dict[str, str]:
        return {"public_key": self.public_key}


@dataclass(frozen=True)
class JobSpec:
    """A validated job. `env` and `registry_auth` hold secret values in memory only; see
    `to_dict(redact=True)`."""

    id: str
    run_name: str
    run_id: str | None = None
    image: str | None = None
    commands: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    env: dict[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()
    working_dir: str | None = None
    user: str | None = None
    ports: tuple[PortSpec, ...] = ()
    gpus: Any = 0
    """An int (how many) or a tuple of explicit indices."""
    gpu_share: int | None = None
    """Thousandths of one GPU (1..999) the job shares with others; None: whole GPUs."""
    cpus: float | None = None
    memory: int | None = None
    shm_size: int | None = None
    volumes: tuple[VolumeSpec, ...] = ()
    disks: tuple[DiskSpec, ...] = ()
    network_mode: str = "host"
    labels: dict[str, str] = field(default_factory=dict)
    privileged: bool = False
    stop_timeout: float = 10.0
    max_duration: float | None = None
    registry_auth: RegistryAuth | None = None
    code: str | None = None
    """The sha256 of an uploaded code archive, unpacked into the job before it starts."""
    ssh: SSHAccess | None = None
    """An SSH server for the job (dev environments), letting this public key in."""
    mask: tuple[str, ...] = ()
    """Secret values the job's env holds inside larger values (`postgres://u:PW@h`): masked
    in its output too. Memory only: never in `to_dict`, so never in a record."""

    @property
    def gpu_count(self) -> int:
        """How many GPUs the job needs."""
        return len(self.gpus) if isinstance(self.gpus, tuple) else int(self.gpus)

    def secret_values(self) -> list[str]:
        """The values of the env variables named in `secret_env` and the bare secrets of
        `mask` (what the job's log masks); none for a spec read back from a record, which
        holds the redaction marker instead."""
        values = [
            self.env[name]
            for name in self.secret_env
            if name in self.env and self.env[name] != REDACTED
        ]
        return [*values, *(v for v in self.mask if v not in values)]

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """The spec as JSON data; with `redact`, secret env values and registry credentials
        are replaced by a marker."""
        env = dict(self.env)
        if redact:
            for name in self.secret_env:
                if name in env:
                    env[name] = REDACTED
        auth = self.registry_auth
        # Left out when unset, as older agents wrote their records.
        code = {} if self.code is None else {"code": self.code}
        share = {} if self.gpu_share is None else {"gpu_share": self.gpu_share}
        disks = {"disks": [_disk_dict(d) for d in self.disks]} if self.disks else {}
        ssh = {} if self.ssh is None else {"ssh": self.ssh.to_dict()}
        return {
            "id": self.id,
            "run_name": self.run_name,
            "run_id": self.run_id,
            "image": self.image,
            "commands": list(self.commands),
            "entrypoint": None if self.entrypoint is None else list(self.entrypoint),
            "env": env,
            "secret_env": list(self.secret_env),
            "working_dir": self.working_dir,
            "user": self.user,
            "ports": [
                {"container_port": p.container_port, "host_port": p.host_port} for p in self.ports
            ],
            "gpus": list(self.gpus) if isinstance(self.gpus, tuple) else self.gpus,
            **share,
            "cpus": self.cpus,
            "memory": self.memory,
            "shm_size": self.shm_size,
            "volumes": [
                {
                    "host_path": v.host_path,
                    "container_path": v.container_path,
                    "read_only": v.read_only,
                }
                for v in self.volumes
            ],
            **disks,
            "network_mode": self.network_mode,
            "labels": dict(self.labels),
            "privileged": self.privileged,
            "stop_timeout": self.stop_timeout,
            "max_duration": self.max_duration,
            "registry_auth": None if auth is None else auth.to_dict(redact),
            **code,
            **ssh,
        }


class _Checker:
    """Collects problems so one answer lists every bad field, not just the first."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.problems: list[tuple[str, str]] = []

    def bad(self, name: str, message: str) -> None:
        self.problems.append((name, message))

    def string(self, name: str, value: Any, max_len: int = PATH_MAX) -> str | None:
        if not isinstance(value, str):
            self.bad(name, f"must be a string, not {_kind(value)}")
            return None
        if "\x00" in value:
            self.bad(name, "must not contain NUL characters")
            return None
        if len(value.encode()) > max_len:
            self.bad(name, f"is {len(value.encode())} bytes; the limit is {max_len}")
            return None
        return value

    def optional_string(self, name: str, max_len: int = PATH_MAX) -> str | None:
        value = self.data.get(name)
        return None if value is None else self.string(name, value, max_len)

    def number(self, name: str, low: float, high: float, low_inclusive: bool) -> float | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.bad(name, f"must be a number, not {_kind(value)}")
            return None
        too_low = value < low if low_inclusive else value <= low
        if too_low or value > high or value != value:
            relation = ">=" if low_inclusive else ">"
            self.bad(name, f"must be {relation} {low:g} and <= {high:g}, got {value!r}")
            return None
        return float(value)

    def integer(self, name: str, value: Any, low: int, high: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.bad(name, f"must be an integer, not {_kind(value)}")
            return None
        if not low <= value <= high:
            self.bad(name, f"must be between {low} and {high}, got {value}")
            return None
        return value

    def boolean(self, name: str) -> bool:
        value = self.data.get(name, False)
        if not isinstance(value, bool):
            self.bad(name, f"must be true or false, not {_kind(value)}")
            return False
        return value

    def string_list(self, name: str, value: Any) -> list[str] | None:
        if not isinstance(value, list):
            self.bad(name, f"must be a list of strings, not {_kind(value)}")
            return None
        out = []
        for i, item in enumerate(value):
            checked = self.string(f"{name}[{i}]", item, COMMANDS_MAX)
            if checked is not None:
                out.append(checked)
        return out

    def string_map(self, name: str) -> dict[str, Any]:
        value = self.data.get(name, {})
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.bad(name, f"must be an object of strings, not {_kind(value)}")
            return {}
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


_FIELDS = frozenset(JobSpec.__dataclass_fields__)


def parse_job_spec(data: Any) -> JobSpec:
    """Validate a submitted JSON object into a JobSpec, or raise SpecError naming each field."""
    if not isinstance(data, dict):
        raise SpecError([("body", f"must be a JSON object, not {_kind(data)}")])
    c = _Checker(data)
    for name in sorted(set(data) - _FIELDS):
        c.bad(name, "unknown field")

    job_id = data.get("id")
    if job_id is None:
        job_id = str(uuid.uuid4())
    elif not isinstance(job_id, str) or not _ID.fullmatch(job_id):
        c.bad("id", "must be 1-128 letters, digits, '_', '.', '-' starting with a letter or digit")
    run_name = data.get("run_name")
    if run_name is None:
        c.bad("run_name", "is required")
    elif not isinstance(run_name, str) or not _ID.fullmatch(run_name):
        c.bad("run_name", "must be 1-128 letters, digits, '_', '.', '-'")
    run_id = c.optional_string("run_id", 128)

    image = c.optional_string("image", 512)
    if image is not None:
        problem = image_reference_error(image)
        if problem:
            c.bad("image", problem)

    commands = c.string_list("commands", data.get("commands", [])) or []
    if len(" && ".join(commands).encode()) > COMMANDS_MAX:
        c.bad("commands", f"joined, they exceed {COMMANDS_MAX} bytes")
    entrypoint = None
    if data.get("entrypoint") is not None:
        entrypoint = c.string_list("entrypoint", data["entrypoint"])
        if entrypoint is not None and (not entrypoint or not entrypoint[0]):
            c.bad("entrypoint", "must start with a non-empty program")

    env, secret_env = _check_env(c)
    mask = _check_mask(c)
    working_dir = c.optional_string("working_dir")
    user = c.optional_string("user", 129)
    if user is not None and not _USER.fullmatch(user):
        c.bad("user", "must be user[:group] of names or numeric ids")
    ports = _check_ports(c)
    gpus = _check_gpus(c)
    gpu_share = _check_gpu_share(c, gpus)
    cpus = c.number("cpus", 0, 4096, low_inclusive=False)
    memory = None
    if data.get("memory") is not None:
        memory = c.integer("memory", data["memory"], MIN_MEMORY, 2**62)
    shm_size = None
    if data.get("shm_size") is not None:
        shm_size = c.integer("shm_size", data["shm_size"], 1, 2**62)
    volumes = _check_volumes(c)
    disks = _check_disks(c)
    network_mode = data.get("network_mode", "host")
    if network_mode not in NETWORK_MODES:
        c.bad("network_mode", f"must be one of {', '.join(NETWORK_MODES)}, got {network_mode!r}")
    labels = _check_labels(c)
    privileged = c.boolean("privileged")
    stop_timeout = c.number("stop_timeout", 0, 3600, low_inclusive=True)
    max_duration = c.number("max_duration", 0, 366 * 86400, low_inclusive=False)
    registry_auth = _check_registry_auth(c)
    code = c.optional_string("code", 64)
    if code is not None and not _SHA256.fullmatch(code):
        c.bad("code", "must be the sha256 (64 lower-case hex digits) of an uploaded archive")
    ssh = _check_ssh(c)

    if image is None:
        _check_process_only(c, commands, entrypoint, volumes, privileged, network_mode)
        if disks:
            c.bad("disks", "need an image (the process runtime cannot mount)")
        if registry_auth is not None:
            c.bad("registry_auth", "needs an image to pull")
    elif working_dir is not None and not working_dir.startswith("/"):
        c.bad("working_dir", "must be an absolute path inside the container")
    if c.problems:
        raise SpecError(c.problems)
    assert isinstance(run_name, str)  # checked above
    return JobSpec(
        id=job_id,
        run_name=run_name,
        run_id=run_id,
        image=image,
        commands=tuple(commands),
        entrypoint=None if entrypoint is None else tuple(entrypoint),
        env=env,
        secret_env=tuple(secret_env),
        mask=tuple(mask),
        working_dir=working_dir,
        user=user,
        ports=tuple(ports),
        gpus=gpus,
        gpu_share=gpu_share,
        cpus=cpus,
        memory=memory,
        shm_size=shm_size,
        volumes=tuple(volumes),
        disks=tuple(disks),
        network_mode=network_mode,
        labels=labels,
        privileged=privileged,
        stop_timeout=10.0 if stop_timeout is None else stop_timeout,
        registry_auth=registry_auth,
        max_duration=max_duration,
        code=code,
        ssh=ssh,
    )


def _check_ssh(c: _Checker) -> SSHAccess | None:
    value = c.data.get("ssh")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"public_key"}:
        c.bad("ssh", "must be an object with exactly public_key")
        return None
    key = c.string("ssh.public_key", value["public_key"], 16 * 1024)
    if key is not None and not _PUBLIC_KEY.fullmatch(key.strip()):
        c.bad("ssh.public_key", "must be one OpenSSH public key line (ssh-ed25519 AAAA...)")
        return None
    return None if key is None else SSHAccess(key.strip())


def _check_env(c: _Checker) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    total = 0
    for name, value in c.string_map("env").items():
        if not _ENV_NAME.fullmatch(name):
            c.bad(
                f"env.{name[:64]}",
                "is not a valid variable name (1-256 characters, no '=', no control characters)",
            )
            continue
        checked = c.string(f"env.{name}", value, ENV_VALUE_MAX)
        if checked is not None:
            env[name] = checked
            total += len(name) + len(checked.encode()) + 2
    if total > ENV_TOTAL_MAX:
        c.bad("env", f"is {total} bytes in all; the limit is {ENV_TOTAL_MAX}")
    secret_env: list[str] = []
    raw = c.data.get("secret_env", [])
    if not isinstance(raw, list):
        c.bad("secret_env", f"must be a list of env names, not {_kind(raw)}")
        raw = []
    for i, name in enumerate(raw):
        if not isinstance(name, str) or name not in env:
            c.bad(f"secret_env[{i}]", "must name a variable given in env")
        elif name not in secret_env:
            secret_env.append(name)
    return env, secret_env


def _check_registry_auth(c: _Checker) -> RegistryAuth | None:
    value = c.data.get("registry_auth")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"username", "password"}:
        c.bad("registry_auth", "must be an object with exactly username and password")
        return None
    username = c.string("registry_auth.username", value["username"], 1024)
    password = c.string("registry_auth.password", value["password"], ENV_VALUE_MAX)
    if username is None or password is None:
        return None
    if not username or not password:
        c.bad("registry_auth", "username and password must not be empty")
        return None
    return RegistryAuth(username=username, password=password)


def _check_ports(c: _Checker) -> list[PortSpec]:
    raw = c.data.get("ports", [])
    if not isinstance(raw, list):
        c.bad("ports", f"must be a list, not {_kind(raw)}")
        return []
    ports: list[PortSpec] = []
    for i, item in enumerate(raw):
        name = f"ports[{i}]"
        if isinstance(item, int) and not isinstance(item, bool):
            item = {"container_port": item}
        if not isinstance(item, dict) or set(item) - {"container_port", "host_port"}:
            c.bad(name, "must be a port number or {container_port, host_port}")
            continue
        container = c.integer(f"{name}.container_port", item.get("container_port"), 1, 65535)
        host = item.get("host_port")
        if host is not None:
            host = c.integer(f"{name}.host_port", host, 1, 65535)
        if container is not None:
            if any(p.container_port == container for p in ports):
                c.bad(name, f"container port {container} is listed twice")
            ports.append(PortSpec(container, host))
    return ports


def _check_gpus(c: _Checker) -> Any:
    raw = c.data.get("gpus", 0)
    if raw is None:
        return 0
    if isinstance(raw, list):
        if len(raw) > MAX_GPUS:
            c.bad("gpus", f"lists {len(raw)} indices; the limit is {MAX_GPUS}")
            return 0
        indices = []
        for i, index in enumerate(raw):
            checked = c.integer(f"gpus[{i}]", index, 0, MAX_GPUS - 1)
            if checked is not None:
                if checked in indices:
                    c.bad("gpus", f"index {checked} is listed twice")
                indices.append(checked)
        return tuple(indices)
    count = c.integer("gpus", raw, 0, MAX_GPUS)
    return 0 if count is None else count


def _check_gpu_share(c: _Checker, gpus: Any) -> int | None:
    """A share is thousandths of exactly one GPU: `gpus` 1, or one explicit index."""
    raw = c.data.get("gpu_share")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 999:
        c.bad("gpu_share", f"must be thousandths of one GPU, 1 to 999, got {raw!r}")
        return None
    if gpus != 1 and not (isinstance(gpus, tuple) and len(gpus) == 1):
        shown = list(gpus) if isinstance(gpus, tuple) else gpus
        c.bad("gpu_share", f"is a share of one GPU: needs gpus 1 or one index, not {shown}")
        return None
    return raw


def _check_volumes(c: _Checker) -> list[VolumeSpec]:
    raw = c.data.get("volumes", [])
    if not isinstance(raw, list):
        c.bad("volumes", f"must be a list, not {_kind(raw)}")
        return []
    volumes: list[VolumeSpec] = []
    for i, item in enumerate(raw):
        name = f"volumes[{i}]"
        if not isinstance(item, dict) or set(item) - {"host_path", "container_path", "read_only"}:
            c.bad(name, "must be {host_path, container_path, read_only}")
            continue
        host = c.string(f"{name}.host_path", item.get("host_path"))
        target = c.string(f"{name}.container_path", item.get("container_path"))
        read_only = item.get("read_only", False)
        if not isinstance(read_only, bool):
            c.bad(f"{name}.read_only", f"must be true or false, not {_kind(read_only)}")
        for key, path in (("host_path", host), ("container_path", target)):
            if path is not None and not path.startswith("/"):
                c.bad(f"{name}.{key}", "must be an absolute path")
        if target == "/":
            c.bad(f"{name}.container_path", "must not be /")
        if host and target and host.startswith("/") and target.startswith("/"):
            volumes.append(VolumeSpec(host, target, read_only is True))
    return volumes


_DISK_KEYS = frozenset({"name", "devices", "container_path", "read_only"})


def _check_disks(c: _Checker) -> list[DiskSpec]:
    raw = c.data.get("disks", [])
    if not isinstance(raw, list):
        c.bad("disks", f"must be a list, not {_kind(raw)}")
        return []
    disks: list[DiskSpec] = []
    for i, item in enumerate(raw):
        where = f"disks[{i}]"
        if not isinstance(item, dict) or set(item) - _DISK_KEYS:
            c.bad(where, "must be {name, devices, container_path, read_only}")
            continue
        name = c.string(f"{where}.name", item.get("name"))
        target = c.string(f"{where}.container_path", item.get("container_path"))
        devices = item.get("devices")
        if (
            not isinstance(devices, list)
            or not devices
            or not all(isinstance(d, str) and d.startswith("/dev/") for d in devices)
        ):
            c.bad(f"{where}.devices", "must be a non-empty list of /dev/ paths")
            continue
        read_only = item.get("read_only", False)
        if not isinstance(read_only, bool):
            c.bad(f"{where}.read_only", f"must be true or false, not {_kind(read_only)}")
        if target is not None and (not target.startswith("/") or target == "/"):
            c.bad(f"{where}.container_path", "must be an absolute path other than /")
        elif name and target:
            disks.append(DiskSpec(name, tuple(devices), target, read_only is True))
    return disks


def _disk_dict(disk: DiskSpec) -> dict[str, Any]:
    return {
        "name": disk.name,
        "devices": list(disk.devices),
        "container_path": disk.container_path,
        "read_only": disk.read_only,
    }


MASK_MAX = 64
"""Most bare secret values one job's log masks."""


def _check_mask(c: _Checker) -> list[str]:
    raw = c.data.get("mask", [])
    if not isinstance(raw, list) or len(raw) > MASK_MAX:
        c.bad("mask", f"must be a list of at most {MASK_MAX} strings")
        return []
    values = []
    for index, value in enumerate(raw):
        checked = c.string(f"mask[{index}]", value, ENV_VALUE_MAX)
        if checked:
            values.append(checked)
    return values


def _check_labels(c: _Checker) -> dict[str, str]:
    labels: dict[str, str] = {}
    for key, value in c.string_map("labels").items():
        if not _LABEL_KEY.fullmatch(key):
            c.bad(f"labels.{key[:64]}", "is not a valid label key")
        elif key.startswith(LABEL_PREFIX):
            c.bad(f"labels.{key}", f"keys starting with {LABEL_PREFIX!r} are set by the agent")
        else:
            checked = c.string(f"labels.{key}", value, 4096)
            if checked is not None:
                labels[key] = checked
    return labels


def _check_process_only(
    c: _Checker,
    commands: list[str],
    entrypoint: list[str] | None,
    volumes: list[VolumeSpec],
    privileged: bool,
    network_mode: str,
) -> None:
    """A job without an image runs as a plain process: container-only fields make no sense."""
    if not commands and not entrypoint:
        c.bad("commands", "a job without an image needs commands or an entrypoint")
    if volumes:
        c.bad("volumes", "need an image (the process runtime cannot mount)")
    if privileged:
        c.bad("privileged", "needs an image (the process runtime has no container)")
    if network_mode != "host":
        c.bad("network_mode", "a job without an image always uses the host network")
