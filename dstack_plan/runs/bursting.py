"""Bursting: a run that its first fleet cannot take now goes to a cloud fleet it names next.

`fleets: [onprem, burst]` reads "on-prem while it fits, the cloud when not". The plan places
the run on its first fleet; when that fails (busy now, or never able to), it tries the cloud
fleets named after it, in order:
- the cloud fleet's machines that are up and free take it, as any fleet's hosts would;
- else new machines, one per job, if the fleet has room under `nodes.max`: the cheapest
  offer that both the fleet's fields and the run's `resources` allow (`fleets/offers.py`). The
  placement carries that `offer`; apply grows the fleet by that many machines
  (`CloudFleetHandler.grow`) and then places the run on them.
The placement's note says where the run goes and why it left the first fleet. The new machines
are the fleet's (its `price_per_hour` counts them); watch releases them once idle for the
fleet's `idle_duration`, down to `nodes.min`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dstack_plan.apply.events import plural
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.cloud_records import CloudFleetRecord
from dstack_plan.fleets.offers import machine_offer, offer_text, ranked_offers, run_zones
from dstack_plan.plan.model import Placement
from dstack_plan.providers.base import Provider
from dstack_plan.runs.jobs import slots

if TYPE_CHECKING:
    from dstack_plan.config.fleet import FleetSpec
    from dstack_plan.config.runs import RunSpec


def room(spec: FleetSpec, record: CloudFleetRecord) -> int | None:
    """Machines the fleet may still add (None: no `nodes.max`)."""
    most = spec.nodes.max if spec.nodes is not None else None
    return None if most is None else max(most - len(record.instances), 0)


async def burst_offer(
    run: RunSpec,
    fleet: str,
    spec: FleetSpec,
    record: CloudFleetRecord,
    providers: Sequence[Provider],
    left: Placement,
    claimed: int = 0,
    volume_zone: str | None = None,
) -> Placement | str:
    """New machines of cloud fleet `fleet` for `run`, which its first fleet could not take
    (`left` says why), in `volume_zone` when its volumes are there; else why not, to add to
    the run's reason: the fleet has no room (beyond the `claimed` machines other runs of the
    plan burst to it for), its cloud is not configured or cannot be asked, no offer fits the
    run, or the fleet's zones exclude its volumes."""
    count = len(slots(run))
    zones = run_zones(spec, volume_zone)
    if isinstance(zones, str):
        return f"fleet {fleet}: {zones}"
    space = room(spec, record)
    space = None if space is None else space - claimed
    if space is not None and space < count:
        most = spec.nodes.max if spec.nodes is not None else None
        taken = f"{len(record.instances)} up" + (
            f", {claimed} more for other runs of this plan" if claimed else ""
        )
        return f"fleet {fleet}: nodes.max {most} reached ({taken}; needs {count} more)"
    if not providers:
        return f"fleet {fleet}: its backend is not configured"
    try:
        ranking = await ranked_offers(spec, providers, run.resources, zones)
    except ProviderError as error:  # the run stays where the plan put it
        return f"fleet {fleet}: offers could not be asked ({error})"
    if not ranking.ranked:
        return f"fleet {fleet}: {ranking.why_none()}"
    best = ranking.ranked[0]
    why = (left.note or "no room").removeprefix("pending: ").removeprefix("cannot be placed: ")
    note = (
        f"burst: {left.fleet} cannot take it now ({why}); "
        f"{plural(count, 'new machine')} {offer_text(best)}"
    )
    return Placement(
        fleet=fleet,
        provider=best.provider,
        price_per_hour=round(count * best.price_per_hour, 4),
        note=note,
        offer=machine_offer(best, count),
    )
