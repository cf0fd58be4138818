"""The gateway's program on its host: TLS in on the public address, each connection relayed
byte for byte to the Unix socket at the host's end of the SSH reverse tunnel that a `dstack
watch` holds open (`watch/gateway_tunnels.py`). Watch's proxy, at the other end, routes by
`Host: <run>.<domain>`, checks the service's token and reaches the replicas through their
hosts' SSH: nothing of a replica is opened on any network, the gateway's included.

Several projects may serve through one gateway (an exported one): each project's watch holds
its own tunnel, and claims its services' host names. A claim is a symbolic link
`routes/<host name>` whose target names the socket, relative to `tunnels/` (`team-b.sock`,
or `../upstream.sock` for the owner's); creating a link is atomic and fails when it exists,
so the first claim of a name holds it. The relay reads the request's `Host` header and
relays the connection to the claimed socket; a name nobody claims goes to the owner's
`upstream.sock`.

Standard library only: it is uploaded as this one file and run with the host's python3
(`python3 gateway_relay.py config.json`). The config (JSON) says `listen_host`,
`listen_port`, `socket` (the owner's tunnel socket path), `routes` and `tunnels` (the
claims' and the other projects' sockets' directories) and, for TLS, `cert` and `key` (PEM
paths). When no watch holds the tunnel, a client gets `503` and a line saying so. On start
it writes `relay.pid` and, once listening, `relay.ready` beside the config.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import ssl
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

_NO_WATCH_BODY = b"no dstack watch serves this gateway now: start dstack watch\n"
NO_WATCH = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_NO_WATCH_BODY), _NO_WATCH_BODY)
)
CHUNK = 65536
HEAD_LIMIT = 65536
HEAD_TIMEOUT = 60.0
"""How long a client may take to send its request's head before the relay hangs up."""
"""The most of a request's head read to find its `Host` (a longer head goes to the owner)."""
_HOST_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,252}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """The request's bytes up to the end of its head (or HEAD_LIMIT, or the end of input)."""
    head = b""
    while b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT:
        data = await reader.read(CHUNK)
        if not data:
            break
        head += data
    return head


def host_of(head: bytes) -> str | None:
    """The host name of the request's `Host` header (lower case, without a port), or None
    when it has none that can name a route."""
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"host":
            host = value.strip().decode("ascii", "replace").lower()
            host = host.rsplit(":", 1)[0].rstrip(".") if not host.startswith("[") else ""
            return host if _HOST_NAME.fullmatch(host) and ".." not in host else None
    return None


def socket_for(host: str | None, config: dict[str, str]) -> str:
    """The socket claimed for `host` (`routes/<host>`), else the owner's."""
    default = config["socket"]
    routes, tunnels = config.get("routes"), config.get("tunnels")
    if host is None or not routes or not tunnels:
        return default
    try:
        target = os.readlink(os.path.join(routes, host))
    except OSError:
        return default
    path = os.path.normpath(os.path.join(tunnels, target))
    # only a project's socket in tunnels/, or the owner's: a link cannot point elsewhere
    if path == os.path.normpath(default) or os.path.dirname(path) == os.path.normpath(tunnels):
        return path
    return default


def _handler(config: dict[str, str]) -> Handler:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(read_head(client_r), HEAD_TIMEOUT)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            await _close(client_w)
            return
        try:
            upstream_r, upstream_w = await asyncio.open_unix_connection(
                socket_for(host_of(head), config)
            )
        except OSError:
            with contextlib.suppress(Exception):
                client_w.write(NO_WATCH)
                await client_w.drain()
            await _close(client_w)
            return
        try:
            upstream_w.write(head)
            await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))
        finally:
            await _close(upstream_w)
            await _close(client_w)

    return handle


async def serve(config_path: Path) -> None:
    """Listen as `config_path` says, until killed."""
    config = json.loads(config_path.read_text())
    context = None
    if config.get("cert"):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(config["cert"], config["key"])
    server = await asyncio.start_server(
        _handler(config),
        config["listen_host"],
        int(config["listen_port"]),
        ssl=context,
        ssl_handshake_timeout=10 if context else None,
        reuse_address=True,
    )
    (config_path.parent / "relay.ready").write_text(str(config["listen_port"]))
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gateway_relay.py CONFIG.json", file=sys.stderr)
        return 2
    config_path = Path(argv[1]).resolve()
    (config_path.parent / "relay.pid").write_text(str(os.getpid()))
    try:
        asyncio.run(serve(config_path))
    except OSError as e:
        print(f"gateway relay: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
