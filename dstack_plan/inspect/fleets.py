"""The read side of fleets' hosts (SSH fleets, and cloud fleets' booted machines), as state
(or a refresh) records them."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict

from dstack_plan.apply.handlers import ApplyContext, ResourceHandler
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.records import BandwidthRecord, FleetRecord, HostRecord
from dstack_plan.sharing.imports import SEPARATOR, Imports, is_imported
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.commit import commit_async
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.model import State, timestamp


def fleet_records(state: State, name: str | None = None) -> dict[str, FleetRecord]:
    """Fleet name -> its record, for every fleet in `state` (only `name` when given)."""
    found = {
        entry.address.split(".", 1)[1]: FleetRecord.of(entry)
        for entry in state.resources.values()
        if entry.kind == "fleet" and not entry.tainted
    }
    if name is None:
        return found
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise DstackPlanError(f"no fleet {name!r} in the state (fleets: {known})")
    return {name: found[name]}


def imported_records(imports: Imports) -> dict[str, FleetRecord]:
    """`owner/name` -> the record of each fleet another project exports to this one, as the
    owner's state records it (its last apply or watch); an owner whose state cannot be read
    is left out (plan names why)."""
    shared, _ = imports.shared_with_me()
    return {name: FleetRecord.of(entry) for name, entry in shared.items()}


class FleetView(BaseModel):
    """One fleet and its hosts' facts, as state records them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """`gpu`, or another project's exported fleet as `owner/gpu`."""
    owner: str | None = None
    """The project that owns an imported fleet (None: this project's)."""
    status: str
    """`active` when every host answered its last check, else `degraded`."""
    hosts: tuple[HostRecord, ...] = ()
    bandwidth: BandwidthRecord | None = None
    """The last `dstack fleet probe` (absent: never probed)."""


class FleetList(BaseModel):
    """`dstack fleet list --json` (and the HTTP API's `/api/fleets`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleets: tuple[FleetView, ...] = ()


def fleet_list(records: dict[str, FleetRecord]) -> FleetList:
    return FleetList(
        fleets=tuple(
            FleetView(
                name=name,
                owner=name.partition(SEPARATOR)[0] if is_imported(name) else None,
                status=r.status,
                hosts=r.hosts,
                bandwidth=r.bandwidth,
            )
            for name, r in records.items()
        )
    )


def fleets_json(records: dict[str, FleetRecord]) -> dict[str, Any]:
    """What `dstack fleet list --json` prints: `{"fleets": [{name, status, hosts: [...]}]}`
    (a `FleetList`; `bandwidth` only for a fleet that was probed, `owner` only for another
    project's)."""
    document = fleet_list(records).model_dump(mode="json")
    for fleet in document["fleets"]:
        for key in ("bandwidth", "owner"):
            if fleet[key] is None:
                del fleet[key]
    return document


def host_rows(records: dict[str, FleetRecord]) -> list[list[str]]:
    """One row per host: fleet, host, status, GPUs, CPUs, memory, disk, agent (version, and
    how it runs: `systemd`, or `detached` when it will not survive a reboot)."""
    rows = []
    for name, record in records.items():
        for host in record.hosts:
            res = host.resources
            gpus = "-"
            if res is not None and res.gpus:
                gpus = f"{len(res.gpus)}x{res.gpus[0].name}"
            rows.append(
                [
                    name,
                    host.name,
                    _status(host),
                    gpus,
                    str(res.cpus) if res else "-",
                    f"{res.memory_gb:g}GB" if res else "-",
                    f"{res.disk_gb:g}GB" if res else "-",
                    _agent(host),
                ]
            )
    return rows


def _status(host: HostRecord) -> str:
    """`idle`, `unreachable since <UTC time>` (as watch marked it), with the last problem."""
    status = host.status
    if status == "unreachable" and host.unreachable_since is not None:
        since = datetime.fromtimestamp(host.unreachable_since, timezone.utc)
        status += f" since {since.strftime('%Y-%m-%d %H:%M:%S')} UTC"
    elif host.failed_checks:
        status += f" ({host.failed_checks} failed check{'s' if host.failed_checks > 1 else ''})"
    return status if not host.problem else f"{status}: {host.problem}"


def _agent(host: HostRecord) -> str:
    version = host.agent_version or "-"
    if host.agent_persistent is None:
        return version
    return f"{version}, {'systemd' if host.agent_persistent else 'detached'}"


def reboot_note(records: dict[str, FleetRecord]) -> str | None:
    """What `dstack fleet list` says under its table about hosts whose agent will not come
    back after a reboot (None when there are none)."""
    hosts = [h.name for r in records.values() for h in r.hosts if h.agent_persistent is False]
    if not hosts:
        return None
    return (
        f"agent: detached on {', '.join(hosts)} (will not survive a reboot; the next command "
        "that needs it starts it again)"
    )


async def trust_host(
    backend: StateBackend,
    fleet: str,
    host: str,
    handler: ResourceHandler,
    ctx: ApplyContext,
) -> tuple[str | None, HostRecord]:
    """Forget the pinned host key of `host` in `fleet`, then ask the fleet's hosts again
    (`handler.refresh`), so the key the host presents now is pinned and recorded in the same
    commit. Returns the fingerprint forgotten (None if none was pinned) and the host as
    refreshed. Holds the operation lock."""
    address = f"fleet.{fleet}"
    async with hold_lock(backend, "fleet trust", clock=ctx.clock):
        entry = backend.read().state.get(address)
        if entry is None or entry.tainted:
            raise DstackPlanError(f"no fleet {fleet!r} in the state")
        record = FleetRecord.of(entry)
        hosts = record.by_name()
        if host not in hosts:
            known = ", ".join(hosts) or "none"
            raise DstackPlanError(f"fleet {fleet!r} has no host {host!r} (hosts: {known})")
        forgotten = hosts[host].host_key_fingerprint
        untrusted = hosts[host].model_copy(update={"host_key": None, "host_key_fingerprint": None})
        record = FleetRecord(hosts=tuple(untrusted if h.name == host else h for h in record.hosts))
        # the rest of the entry stays (a cloud fleet's instances): only the pin is forgotten
        attributes = {**entry.attributes, **record.to_attributes()}
        entry = entry.updated(now=entry.updated_at, attributes=attributes)
        refreshed = await handler.refresh(entry, ctx)

        def record_pin(latest: State) -> State:
            current = latest.get(address)
            if current is None:
                return latest
            return latest.with_resource(
                current.updated(
                    now=timestamp(ctx.clock),
                    status=refreshed.status,
                    attributes={**current.attributes, **refreshed.attributes},
                )
            )

        await commit_async(backend, record_pin)
    now = FleetRecord.of(entry.updated(now=entry.updated_at, attributes=refreshed.attributes))
    return forgotten, now.by_name()[host]
