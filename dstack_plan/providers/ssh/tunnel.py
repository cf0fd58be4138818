"""The agent client's way to a remote agent: one SSH direct-tcpip channel per request.

The agent listens on the host's own 127.0.0.1 only; sshd opens the channel to it from the
host's side, so no port is opened to the network and none is forwarded on this machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncssh

from dstack_plan.agent.http import Connector, Reader, Writer

AGENT_ADDRESS = "127.0.0.1"


def tunnel(
    connection: Callable[[], Awaitable[asyncssh.SSHClientConnection]], port: int
) -> Connector:
    """A connector opening a channel to the host's 127.0.0.1:`port` over the connection that
    `connection()` returns (the pool's, reopened by it when it dropped)."""

    async def connect() -> tuple[Reader, Writer]:
        conn = await connection()
        try:
            reader, writer = await conn.open_connection(AGENT_ADDRESS, port)
        except asyncssh.ChannelOpenError as e:
            # an OSError, so the client treats it as a failed connection and retries
            raise ConnectionError(
                f"sshd could not open a channel to {AGENT_ADDRESS}:{port}: {e.reason}"
            ) from None
        except asyncssh.Error as e:
            raise ConnectionError(f"the SSH connection failed: {e}") from None
        return reader, writer

    return connect
