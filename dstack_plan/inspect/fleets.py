"""The read side of fleets' hosts (SSH fleets, and cloud fleets' booted machines), as state
(or a refresh) records them, each with its status from what its agent runs now.

    answers = await ask_hosts(project.machines, state, records)   # (fleet, host) -> jobs
    fleets_json(records, answers)

A host's status is `fleets.host_status.host_status` of its record and the jobs its agent lists
now (every project's: `busy` while any runs, else `idle`). `dstack fleet list` asks the agents
as `dstack top` does (side by side, each within top's HOST_TIMEOUT); the UI's `/api/fleets`
takes the answers of its `top` snapshot (`top_answers`). A host whose record says it is not
up (being set up or torn down, or unreachable at its last check) is not asked: its record
says what it is, at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from dstack_plan.apply.handlers import ApplyContext, ResourceHandler
from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.host_status import LIFECYCLE, UNREACHABLE, host_status, unfinished_jobs
from dstack_plan.fleets.records import BandwidthRecord, FleetRecord, HostRecord
from dstack_plan.sharing.imports import SEPARATOR, Imports, is_imported
from dstack_plan.state.backend import StateBackend
from dstack_plan.state.commit import commit_async
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.model import State, timestamp

if TYPE_CHECKING:
    from dstack_plan.fleets.machines import FleetMachines
    from dstack_plan.inspect.top import TopView

HostAnswers = Mapping[tuple[str, str], int | str]
"""(fleet, host) -> the jobs not finished on it now, of every project, as its agent listed
them; or why it did not answer. A host not in it was not asked."""
PARALLELISM = 32


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
    """`active` when every host answered its last check (and, when asked now, now), else
    `degraded`."""
    hosts: tuple[HostRecord, ...] = ()
    bandwidth: BandwidthRecord | None = None
    """The last `dstack fleet probe` (absent: never probed)."""


class FleetList(BaseModel):
    """`dstack fleet list --json` (and the HTTP API's `/api/fleets`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleets: tuple[FleetView, ...] = ()


def asked(host: HostRecord) -> bool:
    """Whether its agent is asked what runs there: not when its record says it is not up."""
    return host.status not in LIFECYCLE and host.status != UNREACHABLE and host.problem is None


async def ask_hosts(
    machines: FleetMachines,
    state: State,
    records: Mapping[str, FleetRecord],
    timeout: float | None = None,
) -> dict[tuple[str, str], int | str]:
    """Each host of `records` that is `asked`: its agent's unfinished jobs, or why it did not
    answer (within `timeout` seconds: top's HOST_TIMEOUT by default), all side by side.
    Whether reaching an agent may start it is `machines.start_agents`' (`fleet list` turns
    it off: a listing asks only the agents that run)."""
    from dstack_plan.inspect.top import HOST_TIMEOUT

    wait = HOST_TIMEOUT if timeout is None else timeout
    limit = asyncio.Semaphore(PARALLELISM)

    async def one(fleet: str, host: str) -> tuple[tuple[str, str], int | str]:
        async with limit:
            try:
                agent = await machines.agent(fleet, host, state)
                return (fleet, host), unfinished_jobs(
                    await asyncio.wait_for(agent.list_jobs(), wait)
                )
            except DstackPlanError as e:
                return (fleet, host), _without_host(str(e), host)
            except asyncio.TimeoutError:
                return (fleet, host), f"no answer within {wait:g}s"

    asks = [one(n, h.name) for n, r in records.items() for h in r.hosts if asked(h)]
    return dict(await asyncio.gather(*asks))


def _without_host(text: str, host: str) -> str:
    """An error without the host's name in front: the row names the host."""
    return text.removeprefix(f"{host}: ")


def top_answers(view: TopView) -> dict[tuple[str, str], int | str]:
    """The answers of a `dstack top` snapshot, as `ask_hosts` gives them."""
    return {
        (h.fleet, h.host): h.tasks if h.tasks is not None else (h.error or "no answer")
        for h in view.hosts
        if h.host
    }


def shown(name: str, record: FleetRecord, answers: HostAnswers) -> FleetRecord:
    """`record` as shown: each host with its status from `host_status`, and why it did not
    answer now as its problem (when its record has none)."""
    hosts = []
    for host in record.hosts:
        answer = answers.get((name, host.name))
        jobs = answer if isinstance(answer, int) else None
        update: dict[str, Any] = {"status": host_status(host.status, jobs)}
        if isinstance(answer, str) and host.problem is None:
            update["problem"] = answer
        hosts.append(host.model_copy(update=update))
    return record.model_copy(update={"hosts": tuple(hosts)})


def fleet_list(records: dict[str, FleetRecord], answers: HostAnswers) -> FleetList:
    """The fleets and their hosts as shown (`shown`), from `answers` (`ask_hosts`)."""
    views = []
    for name, record in records.items():
        r = shown(name, record, answers)
        views.append(
            FleetView(
                name=name,
                owner=name.partition(SEPARATOR)[0] if is_imported(name) else None,
                status=r.status,
                hosts=r.hosts,
                bandwidth=r.bandwidth,
            )
        )
    return FleetList(fleets=tuple(views))


def fleets_json(records: dict[str, FleetRecord], answers: HostAnswers) -> dict[str, Any]:
    """What `dstack fleet list --json` prints: `{"fleets": [{name, status, hosts: [...]}]}`
    (a `FleetList`; `bandwidth` only for a fleet that was probed, `owner` only for another
    project's)."""
    document = fleet_list(records, answers).model_dump(mode="json")
    for fleet in document["fleets"]:
        for key in ("bandwidth", "owner"):
            if fleet[key] is None:
                del fleet[key]
    return document


def host_rows(records: dict[str, FleetRecord], answers: HostAnswers) -> list[list[str]]:
    """One row per host: fleet, host, status, GPUs, CPUs, memory, disk, agent (version, and
    how it runs: `systemd`, or `detached` when it will not survive a reboot)."""
    rows = []
    for name, record in records.items():
        for host in shown(name, record, answers).hosts:
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
    """`idle`, `busy`, `unreachable since <UTC time>` (as watch marked it), ... with the
    last problem."""
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
