"""`type: fleet` — cloud fleets (`nodes`) and SSH fleets (`ssh_config.hosts`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from dstack_plan.config.base import (
    DEFERRED,
    Described,
    FieldConflict,
    ResourceSpec,
    Shorthand,
    Strict,
)
from dstack_plan.config.env import Env
from dstack_plan.config.profile import PlacementParams
from dstack_plan.config.resources import ResourcesSpec

Blocks = int | Literal["auto"]


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


class ProxyJump(Strict):
    model_config = DEFERRED
    hostname: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None


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
    internal_ip: str | None = None
    ssh_key: str | None = None
    blocks: Blocks = 1

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"hostname": value} if isinstance(value, str) else value


class SSHConfig(Strict):
    model_config = DEFERRED
    user: str | None = None
    identity_file: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    proxy_jump: ProxyJump | None = None
    network: str | None = None
    """Private CIDR from which internal IPs are chosen."""
    hosts: tuple[SSHHost, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _hosts_complete(self) -> SSHConfig:
        names = [h.hostname for h in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise FieldConflict(f"hosts listed twice: {', '.join(duplicates)}", "hosts")
        for host in self.hosts:
            if not (host.user or self.user):
                raise FieldConflict(
                    f"host {host.hostname}: no user (set ssh_config.user or the host's)", "hosts"
                )
        with_ip = [h.internal_ip is not None for h in self.hosts]
        if any(with_ip) and not all(with_ip):
            raise FieldConflict("internal_ip must be set on all hosts or on none", "hosts")
        if any(with_ip) and self.network:
            raise FieldConflict("'internal_ip' and 'network' are mutually exclusive", "network")
        return self


class FleetSpec(ResourceSpec, PlacementParams):
    type: Literal["fleet"] = "fleet"
    placement: Literal["any", "cluster"] = "any"
    blocks: Blocks = 1
    nodes: FleetNodes | None = None
    resources: ResourcesSpec | None = None
    ssh_config: SSHConfig | None = None
    env: Env = {}
    """SSH fleets only: merged under each job's env."""

    @model_validator(mode="after")
    def _cloud_or_ssh(self) -> FleetSpec:
        if self.ssh_config is None and self.nodes is None:
            raise ValueError("a fleet needs 'nodes' (cloud fleet) or 'ssh_config' (SSH fleet)")
        if self.ssh_config is not None:
            cloud_only = [
                f
                for f in ("nodes", "resources", "backends", "regions", "instance_types")
                if getattr(self, f) is not None
            ]
            if cloud_only:
                raise FieldConflict(f"SSH fleets do not take {', '.join(cloud_only)}", *cloud_only)
        elif self.env:
            raise FieldConflict("'env' is only for SSH fleets", "env")
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
