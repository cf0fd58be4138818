"""The SSH reverse tunnels that bring a gateway's requests to watch's proxy, and the host
names this project claims there.

For each running gateway of this project, and each other project's gateway (exported to
this one) that one of its services names, the gateway host's end of the tunnel
(`ServedBy.socket`: the owner's `upstream.sock`, another project's `tunnels/<project>.sock`)
is forwarded over the host's SSH connection to the proxy on this machine, and this
project's services' host names are claimed in the gateway's `routes/`
(`gateways/claims.py`); the owner's watch also drops the claims of projects no export
shares the gateway with any more. A tunnel is opened again when its connection dropped,
and closed when its gateway is gone. A host name another project holds is reported once,
and `HostClaims.held` tells `service_routing.py` not to publish the gateway's URL for it.

Requests so make a hairpin: client -> gateway host (TLS) -> this machine (SSH) -> the
replica's host (SSH). It keeps every replica port off every network and needs no key of
the fleets on the gateway; the cost is one more hop, and a gateway serves a project only
while that project's watch runs.
"""

from __future__ import annotations

import logging
import shlex
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncssh

from dstack_plan.errors import DstackPlanError
from dstack_plan.gateways.claims import NoRoutes, sync_claims
from dstack_plan.gateways.handler import SSH_BACKEND, GatewayRecord
from dstack_plan.gateways.served import ServedBy, served_by, services
from dstack_plan.proxy.gateway_layout import ROUTES_DIR
from dstack_plan.sharing.imports import NotImported
from dstack_plan.state.exports import exported_to
from dstack_plan.watch.tick import Acted, Tick

if TYPE_CHECKING:
    from dstack_plan.providers.ssh.connect import Connection
    from dstack_plan.state.model import State

log = logging.getLogger(__name__)

_Key = tuple[str, str, str]
"""(fleet as this project reaches it, host, the tunnel's socket on the host)"""


@dataclass
class HostClaims:
    """What the tunnels actor learnt of the host names, for the routing actor."""

    held: dict[str, str] = field(default_factory=dict)
    """Host names this project's services want that another project holds -> its claim."""


@dataclass
class _Tunnel:
    served: ServedBy
    conn: Connection
    listener: asyncssh.SSHListener

    @property
    def open(self) -> bool:
        return not self.conn.is_closed()

    async def close(self) -> None:
        self.listener.close()
        await self.listener.wait_closed()


class GatewayTunnels:
    """Keeps one reverse tunnel per gateway serving this project (see the module doc)."""

    name = "gateway-tunnels"

    def __init__(self, proxy_host: str, proxy_port: int, claims: HostClaims | None = None):
        self._proxy = (proxy_host, proxy_port)
        """Where watch's proxy listens on this machine."""
        self._tunnels: dict[_Key, _Tunnel] = {}
        self.claims = claims or HostClaims()
        self._told: set[str] = set()
        """What was logged once (a name held, a gateway without routes)."""

    async def act(self, tick: Tick) -> Acted:
        wanted, names = self._wanted(tick)
        for key in list(self._tunnels):
            tunnel = self._tunnels[key]
            if wanted.get(key) != tunnel.served or not tunnel.open:
                await self._tunnels.pop(key).close()
        held: dict[str, str] = {}
        for key, served in wanted.items():
            if key not in self._tunnels:
                try:
                    self._tunnels[key] = await self._open(tick, served)
                except (DstackPlanError, asyncssh.Error, OSError) as e:
                    log.warning(
                        "%s: cannot open the tunnel from %s: %s", key[1], served.gateway, e
                    )
                    continue
            held |= await self._claim(self._tunnels[key], names[key], tick.state)
        self.claims.held = held
        return Acted()

    def _wanted(self, tick: Tick) -> tuple[dict[_Key, ServedBy], dict[_Key, set[str]]]:
        """The gateways serving this project, and the host names to claim on each."""
        project = tick.project
        wanted: dict[_Key, ServedBy] = {}
        names: dict[_Key, set[str]] = defaultdict(set)
        for entry in tick.state.resources.values():
            if entry.kind != "gateway" or entry.provider != SSH_BACKEND or entry.tainted:
                continue
            if entry.status == "running" and "socket" in entry.attributes:
                own = ServedBy(GatewayRecord.of(entry), entry.name, None, project.name)
                wanted[_key(own)] = own
        for entry, spec in services(tick.state):
            try:
                served = served_by(spec, tick.state, project.name, project.imports)
            except NotImported:
                continue  # said by service_routing.py; its claims go with the tunnel's sync
            if served is not None:
                wanted[_key(served)] = served
                names[_key(served)].add(served.hostname(entry.name))
        return wanted, names

    async def _open(self, tick: Tick, served: ServedBy) -> _Tunnel:
        host = served.record.host
        conn = await tick.project.machines.connection(served.fleet, host, tick.state)
        # sshd does not bind over a socket file a dead tunnel left (StreamLocalBindUnlink no)
        await conn.run(f"rm -f -- {shlex.quote(served.socket)}", check=False)
        listener = await conn.forward_remote_path_to_port(served.socket, *self._proxy)
        log.info("%s: serving %s's requests through %s", host, served.gateway, served.socket)
        return _Tunnel(served, conn, listener)

    async def _claim(self, tunnel: _Tunnel, wanted: set[str], state: State) -> dict[str, str]:
        served = tunnel.served
        routes = f"{served.record.directory}/{ROUTES_DIR}"
        evict = _evict_for(served, state)
        try:
            held = await sync_claims(
                tunnel.conn, served.record.host, routes, served.claim_target, wanted, evict
            )
        except NoRoutes:
            self._tell(
                f"{served.gateway}: its relay predates shared gateways (no {routes}): it "
                "serves only its owner's services; apply it again with --replace"
            )
            return {}
        except DstackPlanError as e:
            log.warning("%s: cannot claim the services' host names: %s", served.gateway, e)
            return {}
        for name, holder in held.items():
            self._tell(f"{served.gateway}: host name {name} is held by another claim ({holder})")
        return held

    def _tell(self, message: str) -> None:
        if message not in self._told:
            self._told.add(message)
            log.warning("%s", message)

    async def close(self) -> None:
        for tunnel in self._tunnels.values():
            await tunnel.close()
        self._tunnels.clear()


def _key(served: ServedBy) -> _Key:
    return (served.fleet, served.record.host, served.socket)


def _evict_for(served: ServedBy, state: State) -> Callable[[str], bool]:
    """On the owner's gateway: whether a claim's target is a project no export shares the
    gateway with now. Another project's watch evicts nothing."""
    if served.owner is not None:
        return lambda _target: False

    def evict(target: str) -> bool:
        if target.startswith("..") or "/" in target or not target.endswith(".sock"):
            return False
        project = target.removesuffix(".sock")
        return exported_to(state.exports, "gateway", served.gateway, project) is None

    return evict
