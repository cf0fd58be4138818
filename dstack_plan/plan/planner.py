"""The diff of desired against (refreshed) state: one change per address, with reasons.

Pure: everything it needs (refreshed state, drift found by refresh, placements chosen by the
scheduler) comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from dstack_plan.errors import PlanError
from dstack_plan.graph import dag
from dstack_plan.plan.diff import diff_specs
from dstack_plan.plan.kinds import create_before_destroy, prevents_destroy
from dstack_plan.plan.model import DEPOSED_KEY, Action, Cost, Placement, Plan, ResourceChange
from dstack_plan.state.model import ResourceState, State


class DesiredItem(NamedTuple):
    """One declared resource, normalised, as the planner sees it."""

    address: str
    kind: str
    name: str
    provider: str
    spec: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()


class PlanOptions(NamedTuple):
    destroy: bool = False
    targets: tuple[str, ...] = ()
    replace: tuple[str, ...] = ()
    allow_destroy_protected: tuple[str, ...] = ()
    """Addresses whose prevent_destroy is overridden for this plan (explicit user flag)."""


class PlanInputs(NamedTuple):
    desired: Sequence[DesiredItem]
    state: State
    state_exists: bool
    drift: Mapping[str, str] = MappingProxyType({})
    """address -> why refresh found it gone (e.g. `jobs gone`)."""
    placements: Mapping[str, Placement] = MappingProxyType({})
    options: PlanOptions = PlanOptions()


def make_plan(inputs: PlanInputs) -> Plan:
    desired = {d.address: d for d in inputs.desired}
    state = inputs.state
    options = inputs.options
    _check_known(options, desired, state)
    graph, batches = dag.build_ordered(_edges(desired, state))
    selected = _selected(graph, options, desired, state)

    changes: list[ResourceChange] = []
    for address in _ordered(batches, selected):
        current = state.get(address)
        wanted = None if options.destroy else desired.get(address)
        change = _classify(address, wanted, current, inputs)
        if change is not None:
            changes.append(change)
    _check_prevent_destroy(changes, options)
    warnings = ()
    if options.targets:
        warnings = ("Resource targeting is in effect: the plan may be incomplete.",)
    return Plan.model_construct(
        lineage=state.lineage if inputs.state_exists else "",
        serial=state.serial if inputs.state_exists else 0,
        destroy=options.destroy,
        targets=options.targets,
        replace=options.replace,
        changes=tuple(changes),
        cost=_cost(changes, state),
        warnings=warnings,
    )


def _edges(desired: Mapping[str, DesiredItem], state: State) -> dict[str, tuple[str, ...]]:
    edges = {a: r.depends_on for a, r in state.resources.items()}
    edges.update({a: d.depends_on for a, d in desired.items()})
    known = set(edges)
    return {a: tuple(x for x in deps if x in known) for a, deps in edges.items()}


def _check_known(options: PlanOptions, desired: Mapping[str, Any], state: State) -> None:
    for flag, addresses in (("--target", options.targets), ("--replace", options.replace)):
        for address in addresses:
            if address not in desired and state.get(address) is None:
                raise PlanError(f"{flag} {address}: no such resource in configuration or state")


def _selected(
    graph: Any, options: PlanOptions, desired: Mapping[str, Any], state: State
) -> set[str]:
    everything = set(desired) | set(state.resources)
    if not options.targets:
        return everything
    if options.destroy:
        return dag.with_dependents(graph, options.targets)
    return dag.with_dependencies(graph, options.targets)


def _ordered(batches: list[list[str]], selected: set[str]) -> list[str]:
    return [a for batch in batches for a in batch if a in selected]


def _classify(
    address: str,
    wanted: DesiredItem | None,
    current: ResourceState | None,
    inputs: PlanInputs,
) -> ResourceChange | None:
    placement = inputs.placements.get(address)
    if wanted is None and current is None:
        return None
    if wanted is None:
        assert current is not None
        reason = "destroy requested" if inputs.options.destroy else "not in configuration"
        return ResourceChange(
            address=address, kind=current.kind, name=current.name, provider=current.provider,
            action=Action.DELETE, before=current.spec, reason=reason,
            action_reason=None if inputs.options.destroy else "delete_because_no_resource_config",
            depends_on=current.depends_on,
        )  # fmt: skip
    common = dict(
        address=address, kind=wanted.kind, name=wanted.name, provider=wanted.provider,
        depends_on=wanted.depends_on, placement=placement, secrets=wanted.secrets,
    )  # fmt: skip
    if current is None:
        return ResourceChange(**common, action=Action.CREATE, after=wanted.spec)
    if address in inputs.drift:
        return ResourceChange(
            **common, action=Action.CREATE, before=current.spec, after=wanted.spec,
            reason=f"drift: {inputs.drift[address]}",
        )  # fmt: skip
    diff = diff_specs(wanted.kind, current.spec, wanted.spec)
    if address in inputs.options.replace:
        return ResourceChange(
            **common, action=_replace_action(wanted), before=current.spec, after=diff.after,
            changed_paths=diff.changed, reason="requested with --replace",
            action_reason="replace_by_request",
        )  # fmt: skip
    if current.tainted:
        return ResourceChange(
            **common, action=_replace_action(wanted), before=current.spec, after=diff.after,
            changed_paths=diff.changed, reason="tainted (a previous apply failed midway)",
            action_reason="replace_because_tainted",
        )  # fmt: skip
    if diff.forces_replacement:
        return ResourceChange(
            **common, action=_replace_action(wanted), before=current.spec, after=diff.after,
            changed_paths=diff.changed, replace_paths=diff.forces_replacement,
            reason="forces replacement: " + ", ".join(diff.forces_replacement),
            action_reason="replace_because_cannot_update",
        )  # fmt: skip
    if DEPOSED_KEY in current.attributes:
        return ResourceChange(
            **common, action=Action.UPDATE, before=current.spec, after=diff.after,
            changed_paths=diff.changed,
            reason="an object left by a failed replacement (deposed) will be destroyed",
        )  # fmt: skip
    if diff.changed:
        return ResourceChange(
            **common, action=Action.UPDATE, before=current.spec, after=diff.after,
            changed_paths=diff.changed, reason="update in place: " + ", ".join(diff.changed),
        )  # fmt: skip
    return ResourceChange(**common, action=Action.NOOP, before=current.spec, after=diff.after)


def _replace_action(wanted: DesiredItem) -> Action:
    if create_before_destroy(wanted.spec):
        return Action.CREATE_THEN_DELETE
    return Action.DELETE_THEN_CREATE


def _check_prevent_destroy(changes: list[ResourceChange], options: PlanOptions) -> None:
    blocked = []
    for change in changes:
        deletes = change.action is Action.DELETE or change.action.is_replace
        if not deletes or change.address in options.allow_destroy_protected:
            continue
        # the configuration decides while it exists; state remembers it once it is gone
        spec = change.after if change.after is not None else change.before
        if prevents_destroy(change.kind, spec):
            blocked.append(change.address)
    if blocked:
        listed = ", ".join(blocked)
        raise PlanError(
            f"{listed}: lifecycle.prevent_destroy forbids destroying "
            f"{'it' if len(blocked) == 1 else 'them'} (volumes are protected by default); "
            "set `lifecycle: {prevent_destroy: false}` in the configuration, or pass "
            "--allow-destroy ADDRESS to confirm"
        )


def _cost(changes: list[ResourceChange], state: State) -> Cost:
    before = sum(_price(r.attributes) for r in state.resources.values())
    after = before
    for change in changes:
        current = state.get(change.address)
        old = _price(current.attributes) if current else 0.0
        if change.action is Action.DELETE:
            after -= old
        elif change.action is not Action.NOOP:
            new = change.placement.price_per_hour if change.placement else old
            after += new - old
    return Cost.model_construct(before=round(before, 4), after=round(max(after, 0.0), 4))


def _price(attributes: Mapping[str, Any]) -> float:
    value = attributes.get("price_per_hour", 0.0)
    return float(value) if isinstance(value, int | float) else 0.0
