"""Local port forwards: a port on this machine's 127.0.0.1 reaching a port on a host.

    forward = await open_forward(conn, "gpu-1", remote_port=8000)
    print(forward.local_port)   # connect here; sshd connects to 127.0.0.1:8000 on the host
    await forward.close()

The listener rides the host's one pooled SSH connection (a direct-tcpip channel per accepted
connection, as the agent tunnel does) and listens on loopback only, never on every address:
what a job serves is not opened to this machine's network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncssh

LISTEN_ADDRESS = "127.0.0.1"
"""Where forwards listen on this machine."""
REMOTE_ADDRESS = "127.0.0.1"
"""Where sshd connects on the host: bridged containers publish on its loopback, and jobs on
the host network listen there too."""


class Listener(Protocol):
    """What accepts the forwarded connections: an SSH listener, or a Kubernetes cluster's
    HTTP relay (`providers/kubernetes/relay.py`)."""

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


@dataclass
class Forward:
    """A port of a host, reachable on this machine's `LISTEN_ADDRESS`:`local_port`."""

    host: str
    remote_port: int
    local_port: int
    listener: Listener | None = None
    """The SSH listener (or relay); None when nothing is forwarded (see `direct`)."""

    @property
    def forwarded(self) -> bool:
        """Whether connections go through SSH (False: the port is on this machine)."""
        return self.listener is not None

    @classmethod
    def direct(cls, host: str, port: int) -> Forward:
        """A port already on this machine (the local fleet): nothing to forward or close."""
        return cls(host=host, remote_port=port, local_port=port)

    async def close(self) -> None:
        """Stop listening; connections already accepted end with the SSH connection."""
        if self.listener is not None:
            self.listener.close()
            await self.listener.wait_closed()
            self.listener = None


async def open_forward(
    conn: asyncssh.SSHClientConnection,
    host: str,
    remote_port: int,
    local_port: int = 0,
    remote_address: str = REMOTE_ADDRESS,
) -> Forward:
    """Listen on `LISTEN_ADDRESS`:`local_port` here (0: any free port) and forward every
    connection over `conn` to `remote_address`:`remote_port` as `host` reaches it (its own
    loopback by default; a Slurm login node forwards to a compute node's address).

    Raises OSError when the local port cannot be bound (in use, or privileged)."""
    listener = await conn.forward_local_port(
        LISTEN_ADDRESS, local_port, remote_address, remote_port
    )
    return Forward(
        host=host, remote_port=remote_port, local_port=listener.get_port(), listener=listener
    )
