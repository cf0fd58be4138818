"""Which gateway serves a service, at what host name, and where this project's tunnel to it
ends.

A service names a gateway of its project (`gateway: gw`), takes the project's default one,
or names another project's gateway exported to this one (`gateway: platform/gw` or
`{project: platform, name: gw}`, read from the owner's state: `sharing/imports.py`). It is
served at `<run>.<domain>`; the gateway's domain may hold `${{ run.project_name }}`,
dstack's way to give each project that shares a gateway names of its own
(`gpu.${{ run.project_name }}.example.com`).

Each project serves its own services, with its own `dstack watch` (its proxy counts their
requests for its autoscaler): on the owner's gateway host the owner's tunnel ends at
`upstream.sock`, another project's at `tunnels/<project>.sock`, and each watch claims its
services' host names in `routes/` (`proxy/gateway_relay.py`, `watch/gateway_tunnels.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dstack_plan.config.interpolation import resolve
from dstack_plan.config.profile import reference_parts
from dstack_plan.config.runs import ServiceSpec
from dstack_plan.gateways.handler import GatewayRecord
from dstack_plan.graph.references import gateway_of
from dstack_plan.plan.model import Action, Plan
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.proxy.gateway_layout import SOCKET_NAME, TUNNELS_DIR
from dstack_plan.sharing.imports import SEPARATOR, Imports, NotImported
from dstack_plan.state.model import ResourceState, State


def domain_label(project: str) -> str:
    """Project `project`'s name as it goes into a host name: lower case, `_` as `-`."""
    return project.lower().replace("_", "-")


@dataclass(frozen=True)
class ServedBy:
    """The gateway that serves one of this project's services."""

    record: GatewayRecord
    gateway: str
    """As this project names it: `gw`, or `platform/gw` for another project's."""
    owner: str | None
    """The project that owns it; None for this project's own."""
    project: str
    """This project's name (the services')."""

    @property
    def fleet(self) -> str:
        """The gateway host's fleet as this project reaches it (`platform/edge` when imported)."""
        return (
            self.record.fleet
            if self.owner is None
            else f"{self.owner}{SEPARATOR}{self.record.fleet}"
        )

    @property
    def socket(self) -> str:
        """Where this project's reverse tunnel listens on the gateway's host."""
        if self.owner is None:
            return self.record.socket
        return f"{self.record.directory}/{TUNNELS_DIR}/{self.project}.sock"

    @property
    def claim_target(self) -> str:
        """What this project's claims of host names point at, relative to `tunnels/`."""
        return f"../{SOCKET_NAME}" if self.owner is None else f"{self.project}.sock"

    def hostname(self, run: str) -> str:
        """The host name the gateway serves this project's run `run` at."""
        return host_name(self.record.domain, run, self.project)

    def url(self, run: str) -> str:
        """Where the gateway serves run `run`."""
        scheme = "https" if self.record.tls else "http"
        default = 443 if self.record.tls else 80
        port = "" if self.record.port == default else f":{self.record.port}"
        return f"{scheme}://{self.hostname(run)}{port}/"


def host_name(domain: str, run: str, project: str) -> str:
    """`<run>.<domain>`, the domain's `${{ run.project_name }}` made `project`'s label."""
    values = {"run": {"project_name": domain_label(project)}}
    try:
        return f"{run}.{resolve(domain, values)}"
    except KeyError:  # refused at load (config/gateway.py)
        return f"{run}.{domain}"


def served_by(
    spec: ServiceSpec, state: State, project: str, imports: Imports | None
) -> ServedBy | None:
    """The running gateway that serves `spec`: one of `state` (the one it names, else the
    default), or another project's exported to this one. None when it has none; NotImported
    when it names another project's that this one cannot use."""
    if spec.gateway is not None and not isinstance(spec.gateway, bool):
        owner, name = reference_parts(spec.gateway)
        if owner is not None:
            if imports is None:
                raise NotImported(f"gateway {name!r} of project {owner!r}: no projects file read")
            theirs = imports.gateway(owner, name)
            if theirs.status != "running" or "socket" not in theirs.attributes:
                return None
            return ServedBy(GatewayRecord.of(theirs), f"{owner}{SEPARATOR}{name}", owner, project)
    entry = service_gateway(spec, state)
    if entry is None:
        return None
    return ServedBy(GatewayRecord.of(entry), entry.name, None, project)


def service_gateway(spec: ServiceSpec, state: State) -> ResourceState | None:
    """The entry of the running gateway in `state` that serves service `spec` (the one it
    names, else the default gateway), or None."""
    gateways = [
        e
        for e in state.resources.values()
        if e.kind == "gateway" and not e.tainted and e.status == "running"
    ]
    if not gateways:
        return None
    default = next((e.name for e in gateways if e.spec.get("default")), None)
    name = gateway_of(spec, default)
    return next((e for e in gateways if e.name == name), None)


def services(state: State) -> Iterator[tuple[ResourceState, ServiceSpec]]:
    """Every service of `state` (not tainted), with its spec."""
    for entry in sorted(state.resources.values(), key=lambda e: e.address):
        if entry.kind == "service" and not entry.tainted:
            spec = spec_from_normalized("service", dict(entry.spec))
            assert isinstance(spec, ServiceSpec)
            yield entry, spec


def needs_tunnels(state: State) -> bool:
    """Whether a watch of the project of `state` must serve its services for a gateway: it
    has one, or one of its services names another project's."""
    if any(e.kind == "gateway" for e in state.resources.values()):
        return True
    for _, spec in services(state):
        gateway = spec.gateway
        if gateway is not None and not isinstance(gateway, bool):
            if reference_parts(gateway)[0] is not None:
                return True
    return False


def imported_gateway_problems(plan: Plan, project: str, imports: Imports) -> list[str]:
    """What keeps the services `plan` creates or changes from another project's gateway:
    the project, its state, the gateway or its export missing, or a host name the owner's
    own services hold there (one line each, naming the service)."""
    problems: list[str] = []
    for change in plan.changes:
        if change.kind != "service" or change.after is None or change.action is Action.NOOP:
            continue
        spec = spec_from_normalized("service", dict(change.after))
        assert isinstance(spec, ServiceSpec)
        if spec.gateway is None or isinstance(spec.gateway, bool):
            continue
        owner, name = reference_parts(spec.gateway)
        if owner is None:
            continue
        try:
            served = served_by(spec, imports.state_of(owner), project, imports)
        except NotImported as e:
            problems.append(f"{change.address}: {e}")
            continue
        if served is None:
            problems.append(
                f"{change.address}: gateway {name!r} of project {owner!r} is not running"
            )
            continue
        holder = _owner_service_at(served, imports.state_of(owner), change.name)
        if holder is not None:
            problems.append(
                f"{change.address}: host name {served.hostname(change.name)} on gateway "
                f"{served.gateway} is project {owner!r}'s service {holder!r}: rename the run, "
                f"or ask for ${{{{ run.project_name }}}} in the gateway's domain"
            )
    return problems


def _owner_service_at(served: ServedBy, owner_state: State, run: str) -> str | None:
    """The owner's service served by the same gateway at the host name `run` gets there."""
    assert served.owner is not None
    wanted = served.hostname(run)
    for entry, spec in services(owner_state):
        mine = service_gateway(spec, owner_state)
        if mine is not None and mine.name == served.gateway.split(SEPARATOR, 1)[1]:
            if host_name(served.record.domain, entry.name, served.owner) == wanted:
                return entry.name
    return None
