"""`type: fleet` — cloud fleets (`nodes`) and SSH fleets (`ssh_config.hosts`)."""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, field_serializer, model_validator

from dstack_plan.config.base import (
    DEFERRED,
    Described,
    FieldConflict,
    ResourceSpec,
    Shorthand,
    Strict,
)
from dstack_plan.config.env import Env
from dstack_plan.config.labels import HostLabelValues
from dstack_plan.config.profile import PlacementParams
from dstack_plan.config.resources import ResourcesSpec

Blocks = int | Literal["auto"]


def _one_block_at_least(value: int | str) -> int | str:
    if isinstance(value, int) and value < 1:
        raise ValueError(f"blocks must be at least 1 or 'auto', got {value}")
    return value


def _private_ip(value: str | None) -> str | None:
    if value is None:
        return value
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"invalid IP address {value!r}") from None
    if not address.is_private:
        raise ValueError(f"{value} is not a private IP address")
    return value


def _private_network(value: str | None) -> str | None:
    if value is None:
        return value
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"invalid network {value!r}: expected <ip>/<prefix>") from None
    if not network.is_private:
        raise ValueError(f"{value} is not a private network")
    return value


class FleetNodes(Shorthand):
    """How many instances: `min` kept always, `target` provisioned on apply, `max` the cap."""

    model_config = DEFERRED
    _described: ClassVar[Described] = Described(
        "a count such as 2, a range such as 1..4, or {min, target, max}"
    )

    shorthand_schema = (
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^\s*\d*\s*(\.\.)?\s*\d*\s*$"},
    )

    min: int = Field(default=0, ge=0)
    target: int | None = None
    max: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("nodes must be a number, a range or {min, target, max}")
        if isinstance(value, int):
            return {"min": value, "target": value, "max": value}
        if isinstance(value, str):
            text = value.replace(" ", "")
            low, dots, high = text.partition("..")
            try:
                if not dots:
                    n = int(text)
                    return {"min": n, "target": n, "max": n}
                if not low and not high:
                    raise ValueError
                return {"min": int(low) if low else 0, "max": int(high) if high else None}
            except ValueError:
                raise ValueError(
                    f"invalid nodes {value!r}: expected N, MIN..MAX, MIN.. or {{min, target, max}}"
                ) from None
        return value

    @model_validator(mode="after")
    def _ordered(self) -> FleetNodes:
        target = self.min if self.target is None else self.target
        if target < self.min or (self.max is not None and target > self.max):
            raise ValueError("nodes must satisfy min <= target <= max")
        if self.target is None:
            object.__setattr__(self, "target", target)
        return self

    def __str__(self) -> str:
        if self.min == self.max:
            return str(self.min)
        high = "" if self.max is None else str(self.max)
        return f"{self.min}..{high}"


class SSHKey(Strict):
    """A key given inline, as dstack's server stores it: `public`, and `private` optionally."""

    model_config = DEFERRED
    _described: ClassVar[Described] = Described("a mapping {public, private}")
    public: str
    private: str | None = None

    @field_serializer("private")
    def _fingerprint(self, value: str | None) -> str | None:
        # state and plan files hold specs: they get a fingerprint (changes still show in a
        # diff), never the private key itself
        if value is None or value.startswith(_FINGERPRINT):
            return value
        return _FINGERPRINT + hashlib.sha256(value.encode()).hexdigest()


_FINGERPRINT = "sha256:"


class ProxyJump(Strict):
    model_config = DEFERRED
    hostname: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str
    identity_file: str
    ssh_key: SSHKey | None = None


class SSHHost(Shorthand):
    model_config = DEFERRED
    _described: ClassVar[Described] = Described(
        "a host name or {hostname, user, port, ...}", "hosts (names or mappings)"
    )
    shorthand_schema = ({"type": "string"},)
    hostname: str
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    proxy_jump: ProxyJump | None = None
    internal_ip: Annotated[str | None, AfterValidator(_private_ip)] = None
    ssh_key: SSHKey | None = None
    blocks: Annotated[Blocks, AfterValidator(_one_block_at_least)] = 1
    labels: HostLabelValues | None = None
    """Extension: labels runs may require (`rack`, `zone`, `near`...); see `config/labels.py`."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"hostname": value} if isinstance(value, str) else value


class SSHConfig(Strict):
    model_config = DEFERRED
    user: str | None = None
    identity_file: str | None = None
    ssh_key: SSHKey | None = None
    port: int = Field(default=22, ge=1, le=65535)
    proxy_jump: ProxyJump | None = None
    network: Annotated[str | None, AfterValidator(_private_network)] = None
    """Private CIDR from which internal IPs are chosen."""
    hosts: tuple[SSHHost, ...]
    # Hosts without a user, duplicate hosts and internal_ip/network conflicts are refused by
    # the plan (plan/limits.py), as dstack's server does: its parser accepts them.

    def endpoint(self, host: SSHHost) -> tuple[str, int]:
        """Where `host` is reached: its hostname and port (its own, else the fleet's).

        Hosts are told apart by both: several VMs behind one address on different ports
        are distinct hosts.
        """
        return host.hostname, host.port or self.port

    def host_name(self, host: SSHHost) -> str:
        """How messages, pins and jobs name `host`: `hostname`, or `hostname:port` off 22."""
        hostname, port = self.endpoint(host)
        return hostname if port == 22 else f"{hostname}:{port}"

    def hosts_leaving(self, new: SSHConfig) -> list[SSHHost]:
        """This configuration's hosts that `new` (its next version) no longer has, told
        apart by `host_name`."""
        wanted = {new.host_name(h) for h in new.hosts}
        return [h for h in self.hosts if self.host_name(h) not in wanted]


class FleetSpec(ResourceSpec, PlacementParams):
    type: Literal["fleet"] = "fleet"
    placement: Literal["any", "cluster"] = "any"
    blocks: Blocks = 1
    nodes: FleetNodes | None = None
    resources: ResourcesSpec | None = None
    ssh_config: SSHConfig | None = None
    env: Env = {}
    """SSH fleets only: merged under each job's env."""

    null_kept: ClassVar[frozenset[str]] = frozenset({"blocks", "env"})  # dstack refuses null

    @model_validator(mode="after")
    def _blocks(self) -> FleetSpec:
        # cloud vs SSH fields (`nodes` or `ssh_config`, which fields each takes) are checked
        # by the plan (plan/limits.py), as dstack's server does: its parser accepts any mix
        if isinstance(self.blocks, int) and self.blocks < 1:
            raise FieldConflict("blocks must be at least 1 or 'auto'", "blocks")
        return self

    @property
    def is_ssh(self) -> bool:
        return self.ssh_config is not None

    @property
    def provider(self) -> str:
        """Where the fleet's machines come from: `ssh`, its one backend, or `cloud` (any)."""
        if self.is_ssh:
            return "ssh"
        return self.backends[0] if self.backends and len(self.backends) == 1 else "cloud"
