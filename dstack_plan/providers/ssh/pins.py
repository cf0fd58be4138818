"""Where host-key pins are kept: the store `hostkeys.HostKeyPolicy` reads and writes.

No asyncssh here: state code (the fleet records) holds pins without importing the SSH stack.
"""

from __future__ import annotations

from typing import Protocol


class HostKeyStore(Protocol):
    """Where pins live (the provider keeps them in state, per host)."""

    def get(self, host: str) -> str | None: ...

    def put(self, host: str, key: str) -> None: ...

    def forget(self, host: str) -> None: ...


class MemoryHostKeyStore:
    """A `HostKeyStore` in a dict."""

    def __init__(self, pins: dict[str, str] | None = None):
        self.pins: dict[str, str] = dict(pins or {})

    def get(self, host: str) -> str | None:
        return self.pins.get(host)

    def put(self, host: str, key: str) -> None:
        self.pins[host] = key

    def forget(self, host: str) -> None:
        self.pins.pop(host, None)
