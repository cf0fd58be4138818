"""The gateway's program on its host: TLS in on the public address, each connection relayed
byte for byte to the Unix socket at the host's end of the SSH reverse tunnel that `dstack
watch` holds open (`watch/gateway_tunnels.py`). Watch's proxy, at the other end, routes by
`Host: <run>.<domain>`, checks the service's token and reaches the replicas through their
hosts' SSH: nothing of a replica is opened on any network, the gateway's included.

Standard library only: it is uploaded as this one file and run with the host's python3
(`python3 gateway_relay.py config.json`). The config (JSON) says `listen_host`,
`listen_port`, `socket` (the tunnel's socket path) and, for TLS, `cert` and `key` (PEM
paths). When no watch holds the tunnel, a client gets `503` and a line saying so. On start
it writes `relay.pid` and, once listening, `relay.ready` beside the config.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
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


def _handler(socket_path: str) -> Handler:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_unix_connection(socket_path)
        except OSError:
            with contextlib.suppress(Exception):
                client_w.write(NO_WATCH)
                await client_w.drain()
            await _close(client_w)
            return
        try:
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
        _handler(config["socket"]),
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
