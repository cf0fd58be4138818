"""Plain typed inputs of the SSH layer, built from a fleet's `ssh_config`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dstack_plan.errors import DstackPlanError

if TYPE_CHECKING:
    from dstack_plan.config.fleet import ProxyJump, SSHConfig, SSHKey


@dataclass(frozen=True)
class SSHTarget:
    """One host to log in to. `name` is how messages, pins and results refer to it."""

    hostname: str
    user: str
    port: int = 22
    identity_file: str | None = None
    private_key: str | None = None
    """Inline private key content (dstack's `ssh_key.private`); wins over `identity_file`."""
    proxy_jump: SSHTarget | None = None

    @property
    def name(self) -> str:
        # hosts are unique by (hostname, port): several VMs behind one address is common
        return self.hostname if self.port == 22 else f"{self.hostname}:{self.port}"


def _private(key: SSHKey | None) -> str | None:
    return key.private if key is not None else None


def _jump(jump: ProxyJump | None) -> SSHTarget | None:
    if jump is None:
        return None
    return SSHTarget(
        hostname=jump.hostname,
        user=jump.user,
        port=jump.port,
        identity_file=jump.identity_file,
        private_key=_private(jump.ssh_key),
    )


def targets_from_config(config: SSHConfig) -> list[SSHTarget]:
    """One target per host, each host's own fields overriding the fleet-wide ones.

    Raises DstackPlanError for a host with no user to log in as (no guess such as root)."""
    targets = []
    for host in config.hosts:
        user = host.user or config.user
        if not user:
            raise DstackPlanError(
                f"{host.hostname}: no user to log in as: set ssh_config.user or the host's user"
            )
        targets.append(
            SSHTarget(
                hostname=host.hostname,
                user=user,
                port=host.port or config.port,
                identity_file=host.identity_file or config.identity_file,
                private_key=_private(host.ssh_key or config.ssh_key),
                proxy_jump=_jump(host.proxy_jump or config.proxy_jump),
            )
        )
    return targets
