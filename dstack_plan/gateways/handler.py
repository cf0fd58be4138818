"""`type: gateway`: services at `https://<run>.<domain>/`, from a host of a fleet.

Creating one puts the relay (`proxy/gateway_relay.py`) on the host and starts it on
`port` with the TLS certificate the configuration names (`proxy/gateway_install.py`); the
entry records where (fleet, host, address, port, the relay's directory and tunnel socket).
Requests reach the services once a `dstack watch` holds the SSH reverse tunnel to its proxy
(`watch/gateway_tunnels.py`): the relay terminates TLS and passes the bytes on; watch's
proxy routes by host name, checks tokens and reaches the replicas. Deleting stops the
relay and removes its files, key included. The host may be a cloud fleet's machine (a
one-node fleet declared for it): cloud backends do not create gateway machines themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.apply.unsupported import UnsupportedHandler
from dstack_plan.errors import DstackPlanError, ProviderError
from dstack_plan.fleets.records import FleetRecord
from dstack_plan.plan.normalize import spec_from_normalized

if TYPE_CHECKING:
    from dstack_plan.config.gateway import GatewaySpec
    from dstack_plan.fleets.machines import FleetMachines
    from dstack_plan.plan.model import ResourceChange
    from dstack_plan.proxy.gateway_install import GatewaySetup
    from dstack_plan.state.model import ResourceState, State

SSH_BACKEND = "ssh"
LISTEN_HOST = "0.0.0.0"  # noqa: S104 - a gateway is the public face of its services


class GatewayRecord(BaseModel):
    """Where a gateway runs, as its state entry keeps it (no certificate, no key)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    fleet: str
    host: str
    """The fleet's name of the host (`hostname`, or `hostname:port`)."""
    address: str
    """The host's address: where `*.<domain>` must resolve."""
    port: int
    domain: str
    tls: bool
    directory: str
    """The relay's directory on the host."""
    socket: str
    """The Unix socket on the host the reverse tunnel listens on."""

    @classmethod
    def of(cls, entry: ResourceState) -> GatewayRecord:
        return cls.model_validate(entry.attributes)


class GatewayHandler(ResourceHandler):
    """Gateways on SSH hosts (see the module doc)."""

    def __init__(self, machines: FleetMachines):
        self._machines = machines
        self._unsupported = UnsupportedHandler()

    def cannot_create(self, kind: str, provider: str) -> str | None:
        if provider == SSH_BACKEND:
            return None
        return (
            f"the {provider} provider cannot create gateways in this version: declare a "
            "one-node cloud fleet and put the gateway on its machine (backend: ssh, fleet: "
            "NAME; see docs/services.md)"
        )

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        from dstack_plan.proxy.gateway_install import install_gateway

        assert change.after is not None
        spec = _gateway_spec(change.after)
        if spec.backend != SSH_BACKEND:
            return await self._unsupported.create(change, ctx)
        assert spec.fleet is not None and spec.domain is not None
        state = ctx.current_state()
        host, address = _host_of(spec, state)
        setup = _setup(change.name, spec, Path(ctx.project_dir))
        conn = await self._machines.connection(spec.fleet, host, state)
        ctx.progress(change.address, f"starting the gateway on {host}:{spec.port}")
        remote = await install_gateway(conn, host, setup)
        record = GatewayRecord(
            fleet=spec.fleet,
            host=host,
            address=address,
            port=spec.port,
            domain=spec.domain.lower().strip("."),
            tls=setup.cert_pem is not None,
            directory=remote.directory,
            socket=remote.socket,
        )
        return Outcome(status="running", attributes=record.model_dump(mode="json"))

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        # only `default` and `tags` change in place (plan/kinds.py): nothing on the host
        return Outcome(status=current.status, attributes=dict(current.attributes))

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        from dstack_plan.proxy.gateway_install import relay_running

        attributes = dict(current.attributes)
        if current.provider != SSH_BACKEND or current.tainted:
            return Refreshed(current.status, attributes)
        record = GatewayRecord.of(current)
        try:
            conn = await self._machines.connection(record.fleet, record.host, ctx.current_state())
            running = await relay_running(conn, record.host, record.directory)
        except (DstackPlanError, OSError):
            return Refreshed("unreachable", attributes)  # not gone: its host is not answering
        if not running:
            return Refreshed(current.status, attributes, gone="its relay no longer runs")
        return Refreshed("running", attributes)

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        from dstack_plan.proxy.gateway_install import stop_gateway

        if current.provider != SSH_BACKEND or "directory" not in current.attributes:
            return None  # nothing was started (another backend, or a create cut short)
        record = GatewayRecord.of(current)
        state = ctx.current_state()
        if state.get(f"fleet.{record.fleet}") is None:
            return None  # its fleet is gone, and the host with it
        conn = await self._machines.connection(record.fleet, record.host, state)
        await stop_gateway(conn, record.host, record.directory)


def _gateway_spec(spec: dict[str, Any]) -> GatewaySpec:
    from dstack_plan.config.gateway import GatewaySpec

    gateway = spec_from_normalized("gateway", dict(spec))
    assert isinstance(gateway, GatewaySpec)
    return gateway


def _host_of(spec: GatewaySpec, state: State) -> tuple[str, str]:
    """(the fleet's name of the gateway's host, its address)."""
    entry = state.get(f"fleet.{spec.fleet}")
    if entry is None:
        raise ProviderError(SSH_BACKEND, f"fleet {spec.fleet!r} is not in state: apply it first")
    hosts = FleetRecord.of(entry).hosts
    if not hosts:
        raise ProviderError(SSH_BACKEND, f"fleet {spec.fleet!r} has no hosts")
    if spec.host is None:
        return hosts[0].name, hosts[0].hostname
    for host in hosts:
        if spec.host in (host.name, host.hostname):
            return host.name, host.hostname
    names = ", ".join(h.name for h in hosts)
    raise ProviderError(
        SSH_BACKEND, f"fleet {spec.fleet!r} has no host {spec.host!r} (it has {names})"
    )


def _setup(name: str, spec: GatewaySpec, project_dir: Path) -> GatewaySetup:
    """The relay's settings, the certificate and key read from the project's files."""
    from dstack_plan.config.gateway import FileCertificate
    from dstack_plan.proxy.gateway_install import GatewaySetup  # noqa: F811 - the runtime one

    cert = key = None
    if isinstance(spec.certificate, FileCertificate):
        cert = _read(project_dir, spec.certificate.cert, "certificate")
        key = _read(project_dir, spec.certificate.key, "key")
    return GatewaySetup(name, LISTEN_HOST, spec.port, cert, key)


def _read(project_dir: Path, path: str, what: str) -> bytes:
    full = Path(path).expanduser()
    full = full if full.is_absolute() else project_dir / full
    try:
        return full.read_bytes()
    except OSError as e:
        raise DstackPlanError(f"gateway {what} {path}: cannot read it: {e.strerror}") from None
