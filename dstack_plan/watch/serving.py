"""Serving services from watch: the proxy listening here, the actor that keeps its routes
(`service_routing.py`), the one that scales services by the requests it counts
(`autoscale.py`) and the one that keeps the gateways' tunnels to it (`gateway_tunnels.py`),
started and stopped together. The proxy listens on a port of its own, or shares the port
of another server (the UI's) that hands it the services' requests (`leading.py` serves only
while the watch holds the leader lease)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dstack_plan.errors import DstackPlanError

if TYPE_CHECKING:
    from dstack_plan.project import Project
    from dstack_plan.proxy.server import ServiceProxy
    from dstack_plan.watch.autoscale import Autoscaler
    from dstack_plan.watch.gateway_tunnels import GatewayTunnels
    from dstack_plan.watch.service_routing import ServiceRouting


log = logging.getLogger(__name__)


class Listener(Protocol):
    """A server that hands the proxy its requests for services (the UI's)."""

    @property
    def port(self) -> int: ...

    async def close(self) -> None: ...


Listen = Callable[["ServiceProxy"], Awaitable[Listener]]
"""Starts a `Listener` for an opened proxy."""


@dataclass
class Serving:
    url: str
    """Where the proxy listens: `http://127.0.0.1:8080`."""
    routing: ServiceRouting
    autoscaler: Autoscaler
    tunnels: GatewayTunnels
    listener: Listener | None = None
    """The server whose port the proxy shares, if it has none of its own."""

    async def close(self) -> None:
        """Stop the proxy (and the server it shares) and close its SSH forwards and the
        gateways' tunnels."""
        await self.tunnels.close()
        if self.listener is not None:
            await self.listener.close()
        await self.routing.close()


async def serve_services(
    project: Project,
    host: str = "127.0.0.1",
    port: int = 0,
    holder: str | None = None,
    listen: Listen | None = None,
) -> Serving:
    """Start the service proxy on `host`:`port` (0: any free port) for the watch whose
    leader-lease holder id is `holder`; with `listen`, on the port of the server `listen`
    starts on `host` instead. Request rates are counted on the project's clock, which the
    autoscaler's delays are measured on."""
    from dstack_plan.proxy.server import ServiceProxy
    from dstack_plan.proxy.stats import RequestStats
    from dstack_plan.proxy.token import project_token
    from dstack_plan.watch.autoscale import Autoscaler
    from dstack_plan.watch.gateway_tunnels import GatewayTunnels, HostClaims
    from dstack_plan.watch.service_routing import ServiceRouting

    stats = RequestStats(clock=project.clock)
    proxy = ServiceProxy(stats=stats)
    listener: Listener | None = None
    if listen is None:
        try:
            bound = await proxy.start(host, port)
        except OSError as e:
            raise DstackPlanError(f"cannot serve services on {host}:{port}: {e}") from None
    else:
        await proxy.open(host)
        try:
            listener = await listen(proxy)
        except BaseException:
            await proxy.stop()
            raise
        bound = listener.port
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"
    claims = HostClaims()
    routing = ServiceRouting(proxy, project_token(project.directory), url, holder, claims)
    autoscaler = Autoscaler(stats, project.clock.now())
    # a gateway's tunnel ends where the proxy listens (on loopback when it listens on all)
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104
    return Serving(url, routing, autoscaler, GatewayTunnels(local, bound, claims), listener)
