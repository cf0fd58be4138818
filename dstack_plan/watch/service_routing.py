"""Serving services from watch: each tick, the running replicas of every service in state
become the proxy's upstreams (`dstack_plan/proxy/`), each reached on this machine through an
SSH forward to the port its host published (the local fleet's directly: it is this machine).
Forwards stay open from tick to tick while their replica runs and close when it is gone.
The proxy itself health-checks the replicas; this only says which exist. Each service's
URL goes into its state attributes (`service_url`), for `ps`: on the proxy, or for a
service with a gateway (this project's, or another project's exported to it:
`gateways/served.py`), `https://<run>.<domain>/`, which the proxy also routes by host name
(the gateway's requests arrive through `gateway_tunnels.py`). Beside it goes `served_by`,
this watch's lease holder id, so `ps` can tell whether the watch serving it still leads.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dstack_plan.config.runs import ServiceSpec
from dstack_plan.errors import DstackPlanError
from dstack_plan.gateways.served import ServedBy, served_by, services
from dstack_plan.proxy.model import ServiceRoute, Upstream
from dstack_plan.runs.records import SERVED_BY_KEY, SERVICE_URL_KEY, RunRecord
from dstack_plan.sharing.imports import NotImported
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.gateway_tunnels import HostClaims
from dstack_plan.watch.tick import Acted, Tick

if TYPE_CHECKING:
    from dstack_plan.providers.ssh.forward import Forward
    from dstack_plan.proxy.server import ServiceProxy

log = logging.getLogger(__name__)

_Key = tuple[str, str, int, str | None]
"""(fleet, host, published port, its address: a Slurm compute node's, else None)"""


class ServiceRouting:
    """Keeps the proxy's routes to what runs (see the module doc)."""

    name = "services"

    def __init__(
        self,
        proxy: ServiceProxy,
        token: str,
        base_url: str,
        holder: str | None = None,
        claims: HostClaims | None = None,
    ) -> None:
        self._proxy = proxy
        self._token = token
        self._base_url = base_url.rstrip("/")
        """Where the proxy listens (`http://127.0.0.1:8000`)."""
        self._holder = holder
        """This watch's leader-lease holder id, recorded beside each URL for `ps`."""
        self._forwards: dict[_Key, Forward] = {}
        self._claims = claims or HostClaims()
        """The host names another project holds on a gateway (`gateway_tunnels.py`)."""
        self._told: set[str] = set()
        """Why a service has no gateway, logged once."""

    async def act(self, tick: Tick) -> Acted:
        routes: list[ServiceRoute] = []
        used: set[_Key] = set()
        changed: dict[str, ResourceState] = {}
        for entry, spec in services(tick.state):
            upstreams = await self._upstreams(tick, entry, spec, used)
            url = f"{self._base_url}/proxy/services/{entry.name}/"
            hostname = None
            served = self._served_by(tick, entry, spec)
            # a name another project holds on the gateway is not this service's URL there
            if served is not None and served.hostname(entry.name) not in self._claims.held:
                url = served.url(entry.name)
                hostname = served.hostname(entry.name)
            route = ServiceRoute.from_spec(entry.name, spec, upstreams, self._token, hostname)
            routes.append(route)
            recorded = {SERVICE_URL_KEY: url, SERVED_BY_KEY: self._holder}
            if any(entry.attributes.get(k) != v for k, v in recorded.items()):
                attributes = {**entry.attributes, **recorded}
                changed[entry.address] = entry.updated(now=entry.updated_at, attributes=attributes)
        self._proxy.set_routes(routes)
        for key in set(self._forwards) - used:
            await self._forwards.pop(key).close()
        return Acted(changed=changed)

    def _served_by(self, tick: Tick, entry: ResourceState, spec: ServiceSpec) -> ServedBy | None:
        project = tick.project
        try:
            return served_by(spec, tick.state, project.name, project.imports)
        except NotImported as e:
            if str(e) not in self._told:
                self._told.add(str(e))
                log.warning("%s: not served by its gateway: %s", entry.address, e)
            return None

    async def close(self) -> None:
        """Stop the proxy and close the forwards."""
        await self._proxy.stop()
        for forward in self._forwards.values():
            await forward.close()
        self._forwards.clear()

    async def _upstreams(
        self, tick: Tick, entry: ResourceState, spec: ServiceSpec, used: set[_Key]
    ) -> list[Upstream]:
        record = RunRecord.of(entry)
        upstreams = []
        for job in record.jobs:
            published = [
                p
                for p in job.ports
                if p.container_port == spec.port.container_port and p.host_port
            ]
            if job.status != "running" or not published:
                continue
            port = published[0]
            # a Slurm fleet's jobs all name the cluster: the node is the port's address
            key = (record.fleet, job.host, int(port.host_port or 0), port.host_ip)
            forward = self._forwards.get(key)
            if forward is None:
                try:
                    forward = await tick.project.machines.forward(
                        record.fleet, job.host, tick.state, key[2], address=port.host_ip
                    )
                except (DstackPlanError, OSError) as e:
                    log.warning(
                        "%s: cannot reach %s on %s: %s", entry.address, job.id, job.host, e
                    )
                    continue
                self._forwards[key] = forward
            used.add(key)
            upstreams.append(
                Upstream(replica_id=job.id, url=f"http://127.0.0.1:{forward.local_port}")
            )
        return upstreams
