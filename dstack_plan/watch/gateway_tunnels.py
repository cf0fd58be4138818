"""The SSH reverse tunnels that bring a gateway's requests to watch's proxy: for each
running gateway in state, its host's `upstream.sock` (where the relay sends every
connection, `proxy/gateway_relay.py`) is forwarded over the host's SSH connection to the
proxy on this machine. A tunnel is opened again when its connection dropped, and closed
when its gateway is gone.

Requests so make a hairpin: client -> gateway host (TLS) -> this machine (SSH) -> the
replica's host (SSH). It keeps every replica port off every network and needs no key of
the fleets on the gateway; the cost is one more hop, and a gateway serves only while a
watch runs.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncssh

from dstack_plan.errors import DstackPlanError
from dstack_plan.gateways.handler import SSH_BACKEND, GatewayRecord
from dstack_plan.watch.tick import Acted, Tick

if TYPE_CHECKING:
    from dstack_plan.providers.ssh.connect import Connection

log = logging.getLogger(__name__)


@dataclass
class _Tunnel:
    record: GatewayRecord
    conn: Connection
    listener: asyncssh.SSHListener

    @property
    def open(self) -> bool:
        return not self.conn.is_closed()

    async def close(self) -> None:
        self.listener.close()
        await self.listener.wait_closed()


class GatewayTunnels:
    """Keeps one reverse tunnel per running gateway (see the module doc)."""

    name = "gateway-tunnels"

    def __init__(self, proxy_host: str, proxy_port: int):
        self._proxy = (proxy_host, proxy_port)
        """Where watch's proxy listens on this machine."""
        self._tunnels: dict[str, _Tunnel] = {}

    async def act(self, tick: Tick) -> Acted:
        wanted: dict[str, GatewayRecord] = {}
        for entry in tick.state.resources.values():
            if entry.kind != "gateway" or entry.provider != SSH_BACKEND or entry.tainted:
                continue
            if entry.status == "running" and "socket" in entry.attributes:
                wanted[entry.address] = GatewayRecord.of(entry)
        for address in list(self._tunnels):
            tunnel = self._tunnels[address]
            if wanted.get(address) != tunnel.record or not tunnel.open:
                await self._tunnels.pop(address).close()
        for address, record in wanted.items():
            if address in self._tunnels:
                continue
            try:
                self._tunnels[address] = await self._open(tick, record)
            except (DstackPlanError, asyncssh.Error, OSError) as e:
                log.warning("%s: cannot open the tunnel from %s: %s", address, record.host, e)
        return Acted()

    async def _open(self, tick: Tick, record: GatewayRecord) -> _Tunnel:
        conn = await tick.project.machines.connection(record.fleet, record.host, tick.state)
        # sshd does not bind over a socket file a dead tunnel left (StreamLocalBindUnlink no)
        await conn.run(f"rm -f -- {shlex.quote(record.socket)}", check=False)
        listener = await conn.forward_remote_path_to_port(record.socket, *self._proxy)
        log.info("%s: serving the gateway's requests through %s", record.host, record.socket)
        return _Tunnel(record, conn, listener)

    async def close(self) -> None:
        for tunnel in self._tunnels.values():
            await tunnel.close()
        self._tunnels.clear()
