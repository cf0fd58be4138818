"""What the cloud fleets a plan creates or changes will be made of, decided at plan time:
the offer their new machines come from and each fleet's hourly cost after the change."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dstack_plan.plan.diff import diff_specs
from dstack_plan.plan.model import Placement
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.plan.planner import DesiredItem
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.providers.configured import ConfiguredClouds


async def planned_fleet_offers(
    items: list[DesiredItem],
    state: State,
    clouds: Callable[[], ConfiguredClouds],
    short: frozenset[str] = frozenset(),
) -> dict[str, Placement]:
    """What each cloud fleet among `items` that the plan creates or changes (or that is
    `short` of machines) will be made of: the offer its new machines come from and the
    fleet's hourly cost after the change (`fleets/offers.py`). PlanError when no offer
    allows them."""
    wanted = [
        item
        for item in items
        if item.kind == "fleet"
        and not isinstance(item.spec.get("ssh_config"), dict)
        and (item.address in short or fleet_changes(item, state))
    ]
    if not wanted:
        return {}
    from dstack_plan.config.fleet import FleetSpec
    from dstack_plan.fleets.cloud_records import CloudFleetRecord
    from dstack_plan.fleets.offers import fleet_placement

    result: dict[str, Placement] = {}
    for item in wanted:
        spec = spec_from_normalized("fleet", dict(item.spec))
        assert isinstance(spec, FleetSpec)
        current = state.get(item.address)
        record = CloudFleetRecord.of(None if fleet_replaced(item, current) else current)
        providers = clouds().providers(item.provider, state.lineage, creating=False)
        result[item.address] = await fleet_placement(
            item.address, spec, item.provider, record, providers
        )
    return result


def fleet_changes(item: DesiredItem, state: State) -> bool:
    """Whether the plan creates, replaces or changes the fleet `item` declares."""
    current = state.get(item.address)
    if current is None or current.tainted:
        return True
    return not diff_specs("fleet", current.spec, item.spec).empty


def fleet_replaced(item: DesiredItem, current: ResourceState | None) -> bool:
    """Whether the fleet `item` declares gets all-new machines (created or replaced)."""
    if current is None or current.tainted:
        return True
    return bool(diff_specs("fleet", current.spec, item.spec).forces_replacement)
