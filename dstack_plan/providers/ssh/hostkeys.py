"""Host-key checking: `~/.ssh/known_hosts` when it knows the host, else trust on first use.

A pin is the host's public key in OpenSSH form (`ssh-ed25519 AAAA...`). The first key seen for
a host is pinned and reported, so the provider can record it in state; a different key later
is refused (`HostKeyChangedError`, both fingerprints) until `trust(host)` forgets the pin.
"""

from __future__ import annotations

from pathlib import Path

import asyncssh

from dstack_plan.errors import HostKeyChangedError
from dstack_plan.providers.ssh.pins import HostKeyStore, MemoryHostKeyStore

__all__ = ["HostKeyStore", "MemoryHostKeyStore"]  # re-exported: pins live in pins.py


def fingerprint(key: asyncssh.SSHKey | str) -> str:
    """`SHA256:...`, as OpenSSH prints it."""
    if isinstance(key, str):
        key = asyncssh.import_public_key(key)
    return key.get_fingerprint("sha256")


def openssh_line(key: asyncssh.SSHKey) -> str:
    """The key as a pin: `<algorithm> <base64>`, without a comment."""
    return " ".join(key.export_public_key("openssh").decode().split()[:2])


class HostKeyPolicy:
    """Decides whether a host's key is trusted; pins a host's first key."""

    def __init__(self, store: HostKeyStore, known_hosts: Path | None = None):
        self.store = store
        self.known_hosts = known_hosts if known_hosts is not None else _default_known_hosts()
        self.pinned: dict[str, str] = {}
        """Hosts pinned by this policy (first use), to be recorded."""

    def trust(self, host: str) -> None:
        """Forget the host's pin: its next key is trusted on first use again."""
        self.store.forget(host)

    def check(self, host: str, address: str, port: int, key: asyncssh.SSHKey) -> None:
        """Return when `key` is trusted for `host`; raise HostKeyChangedError otherwise."""
        line = openssh_line(key)
        known = self._known(host, address, port)
        if known:
            if line in known:
                return
            raise HostKeyChangedError(
                host, fingerprint(known[0]), fingerprint(key), str(self.known_hosts)
            )
        pin = self.store.get(host)
        if pin is None:
            self.store.put(host, line)
            self.pinned[host] = line
        elif pin != line:
            raise HostKeyChangedError(host, fingerprint(pin), fingerprint(key), "the pinned key")

    def _known(self, host: str, address: str, port: int) -> list[str]:
        if self.known_hosts is None or not self.known_hosts.is_file():
            return []
        hostname = host.rsplit(":", 1)[0] if port != 22 else host
        entries = asyncssh.read_known_hosts(str(self.known_hosts))
        trusted = entries.match(hostname, address, port if port != 22 else None)[0]
        return [openssh_line(k) for k in trusted]


def _default_known_hosts() -> Path | None:
    path = Path.home() / ".ssh" / "known_hosts"
    return path if path.is_file() else None
