"""`dstack offer`: the machines that could take a job with given resources, cheapest first.

    view = await list_offers(project, ResourcesSpec.model_validate({"gpu": "A100:2"}))

The machines are this one (the `local` fleet), the hosts of every SSH fleet in state, the
partitions of every Slurm fleet and the node groups of every Kubernetes fleet in state
(`inspect/engine_offers.py`), and the offers of the cloud backends `.dstack/backends.yml`
configures (`providers/configured.py`; just one backend's offers with `backend=`, `slurm` or
`kubernetes` for that engine's capacity alone).
A fleet's host is shared by the jobs placed on it, so it matches when it can give the lower
bounds (`providers.matching.static_mismatch`); a provider's offer is a whole machine, so every
range must hold it (`offer_mismatch`). Each host's agent is asked what runs there, to say
whether it is idle, available (jobs run, but the GPUs asked for are free) or busy (and with
what); idle, busy and unreachable as `fleets.host_status` decides them for `dstack fleet
list` too. Hosts that do not match are listed apart, with why. Nothing is written.
"""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.errors import DstackPlanError, ProviderError
from dstack_plan.fleets.host_load import BusyJob, busy_jobs
from dstack_plan.fleets.host_status import IDLE, UNREACHABLE, host_status
from dstack_plan.fleets.machines import Machine
from dstack_plan.inspect.offer_rows import (
    Availability,
    OfferRow,
    OfferView,
    Unmatched,
    row_resources,
)
from dstack_plan.providers.base import Offer
from dstack_plan.providers.configured import cloud_providers
from dstack_plan.providers.local import LOCAL_FLEET, LOCAL_PROVIDER
from dstack_plan.providers.matching import (
    gpu_share_wanted,
    gpus_wanted,
    offer_mismatch,
    static_mismatch,
)
from dstack_plan.providers.names import CLOUDS, ENGINES, HOST_FLEET_PROVIDERS
from dstack_plan.providers.registry import GROUP, provider_class
from dstack_plan.scheduler.occupancy import gpu_free, take
from dstack_plan.sharing.imports import imported_fleet_names
from dstack_plan.state.model import State

if TYPE_CHECKING:
    from dstack_plan.project import Project

log = logging.getLogger(__name__)

HOST_PROVIDERS = frozenset({LOCAL_PROVIDER, "ssh"})
"""Providers whose machines are fleet hosts, listed from the fleets, not from `offers()`."""
HOST_TIMEOUT = 15.0
"""Seconds a host's agent gets to list its jobs."""
PARALLELISM = 32
_LAST = frozenset({"busy", "unreachable", "not_available", "no_quota"})
"""Availabilities listed after the others."""


def offer_fleets(state: State) -> list[str]:
    """`local`, then every SSH fleet in state (tainted ones left out: being replaced)."""
    ssh = [
        entry.address.split(".", 1)[1]
        for entry in state.resources.values()
        if entry.kind == "fleet" and entry.provider in HOST_FLEET_PROVIDERS and not entry.tainted
    ]
    return [LOCAL_FLEET, *ssh]


async def list_offers(
    project: Project, requirements: ResourcesSpec, backend: str | None = None
) -> OfferView:
    """The machines that match `requirements`, with availability; see the module doc.
    `backend`: only the offers of that configured cloud backend (no fleet hosts), or with
    `slurm` / `kubernetes` only the partitions / node groups of that engine's fleets."""
    state = project.backend.read().state
    deployment = str(project.deployment)
    rows: list[OfferRow] = []
    unmatched: list[Unmatched] = []
    limit = asyncio.Semaphore(PARALLELISM)
    fleets = offer_fleets(state) + imported_fleet_names(project.imports)
    for fleet in fleets if backend is None else []:
        try:
            found = await project.machines.machines(fleet, state)
        except DstackPlanError as e:
            unmatched.append(Unmatched(fleet=fleet, host="", reason=str(e)))
            continue
        matching: list[Machine] = []
        for machine in found:
            if machine.resources is None:
                reason = machine.problem or "its resources are not known yet"
                unmatched.append(Unmatched(fleet=fleet, host=machine.host, reason=reason))
                continue
            why = static_mismatch(requirements, machine.resources)
            if why is not None:
                unmatched.append(Unmatched(fleet=fleet, host=machine.host, reason=why))
            else:
                matching.append(machine)

        async def row(machine: Machine) -> OfferRow:
            async with limit:
                return await _host_row(project, machine, state, deployment, requirements)

        rows += await asyncio.gather(*(row(m) for m in matching))
    cloud: list[OfferRow] = []
    notes: list[str] = []
    if backend is None or backend in ENGINES:  # the capacity of the engine fleets in state
        from dstack_plan.inspect.engine_offers import engine_rows

        capacity, missed = await engine_rows(project, state, requirements, backend)
        rows += capacity
        unmatched += missed
        if backend is not None and not capacity and not missed:
            notes.append(f"no {backend} fleet in state: apply one first (docs/{backend}.md)")
    if backend not in ENGINES:
        cloud, notes = await _provider_offers(
            project, state.lineage, requirements, backend, unmatched
        )
    ranked = sorted(
        enumerate([*rows, *cloud]),
        key=lambda item: (item[1].availability in _LAST, item[1].price_per_hour, item[0]),
    )
    return OfferView(
        requirements=requirements.pretty(),
        offers=tuple(r for _, r in ranked),
        unmatched=tuple(unmatched),
        notes=tuple(notes),
    )


async def _host_row(
    project: Project, machine: Machine, state: State, deployment: str, req: ResourcesSpec
) -> OfferRow:
    assert machine.resources is not None
    busy: list[BusyJob] | None = None
    error = machine.problem
    if error is None:
        try:
            agent = await project.machines.agent(machine.fleet, machine.host, state)
            jobs = await asyncio.wait_for(agent.list_jobs(), HOST_TIMEOUT)
            busy = busy_jobs(jobs, deployment)
        except DstackPlanError as e:
            error = str(e)
        except asyncio.TimeoutError:
            error = f"no answer within {HOST_TIMEOUT:g}s"
    resources = machine.resources
    held: tuple[str, ...] = ()
    # its status as `fleet list` shows it (a host offered here was set up: its facts are
    # recorded); a busy one is still `available` when the GPUs asked for are free
    status = host_status(IDLE, None if busy is None else len(busy))
    if busy is None or status == UNREACHABLE:
        availability: Availability = "unreachable"
        free = None
    else:
        per_gpu = gpu_free(len(resources.gpus), [b.held for b in busy])
        free = sum(1 for f in per_gpu if f >= WHOLE)  # a GPU shared by a job is not free
        held = tuple(dict.fromkeys(b.held.owner for b in busy))
        wanted = gpus_wanted(req.gpu)
        if status == IDLE:
            availability = "idle"
        elif not wanted or take(per_gpu, wanted, gpu_share_wanted(req.gpu)) is not None:
            availability = "available"
        else:
            availability = "busy"
    return OfferRow(
        fleet=machine.fleet,
        provider=machine.provider,
        host=machine.host,
        region=machine.instance.region,
        price_per_hour=machine.instance.price_per_hour,
        availability=availability,
        free_gpus=None if free is None else max(free, 0),
        held_by=held,
        error=error,
        **row_resources(resources),
    )


async def _provider_offers(
    project: Project,
    lineage: str,
    requirements: ResourcesSpec,
    backend: str | None,
    unmatched: list[Unmatched],
) -> tuple[list[OfferRow], list[str]]:
    """The matching offers of every configured cloud backend and of every third-party
    provider installed through the entry-point group (or just `backend`), with notes on
    those that cannot be asked; offers that do not match go to `unmatched`, each type and
    region once."""
    configured = cloud_providers(project.directory, lineage=lineage, only=backend)
    providers = configured.providers
    notes = list(configured.notes)
    installed = sorted({ep.name for ep in entry_points(group=GROUP)} - HOST_PROVIDERS - CLOUDS)
    providers += [provider_class(name)() for name in installed if backend in (None, name)]
    if backend is not None and backend not in CLOUDS and backend not in installed:
        known = ", ".join(sorted(CLOUDS | set(installed)))
        raise DstackPlanError(f"--backend {backend!r}: no such backend (known: {known})")
    if not providers and not notes:
        return [], ["no cloud backend is configured (.dstack/backends.yml): fleet hosts only"]
    rows: list[OfferRow] = []
    for provider in providers:
        try:
            try:
                offers = await provider.offers(requirements)
            finally:
                await provider.close()
        except DstackPlanError as e:
            detail = e.detail if isinstance(e, ProviderError) else str(e)
            notes.append(f"{provider.name}: could not list offers: {detail}")
            continue
        except Exception as e:  # noqa: BLE001 - a third-party provider must not sink the list
            log.warning("provider %s: offers failed", provider.name, exc_info=True)
            notes.append(f"{provider.name}: could not list offers: {e}")
            continue
        missed: dict[str, str] = {}
        for offer in offers:
            why = offer_mismatch(requirements, offer.resources)
            if why is None:
                rows.append(_offer_row(offer))
            else:
                missed.setdefault(_offer_name(offer), why)  # spot and on-demand: one line
        unmatched += [Unmatched(fleet=None, host=h, reason=r) for h, r in missed.items()]
    return rows, notes


def _offer_name(offer: Offer) -> str:
    return f"{offer.provider} {offer.instance_type} ({offer.region})"


def _offer_row(offer: Offer) -> OfferRow:
    return OfferRow(
        fleet=None,
        provider=offer.provider,
        host=offer.instance_type + (" (spot)" if offer.spot else ""),
        region=offer.region,
        price_per_hour=offer.price_per_hour,
        availability=offer.availability,
        free_gpus=None,
        held_by=(),
        **row_resources(offer.resources),
    )
