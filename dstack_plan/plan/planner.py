"""The diff of desired against (refreshed) state: one change per address, with reasons.

Pure: everything it needs (refreshed state, drift found by refresh, placements chosen by the
scheduler, what the apply handlers cannot do) comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, NamedTuple

from dstack_plan.errors import PlanError
from dstack_plan.graph import dag
from dstack_plan.plan.diff import diff_specs
from dstack_plan.plan.kinds import (
    ROLLOUT_KEY,
    create_before_destroy,
    prevents_destroy,
    rolling_paths,
)
from dstack_plan.plan.model import (
    CREATING,
    DEPOSED_KEY,
    Action,
    Cost,
    Crash,
    Placement,
    Plan,
    ResourceChange,
)
from dstack_plan.plan.suggest import did_you_mean
from dstack_plan.state.model import ResourceState, State

ROLLING_UPDATE = "update_rolling"
"""The `action_reason` of an update that replaces a service's replicas one at a time."""


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
    submission: bool = False
    """A submission (`-f` files, the SDK): create or update what it gives, delete nothing."""
    prune: bool = False
    """A directory plan deletes submitted resources its files do not declare (`--prune`)."""
    context: tuple[str, ...] = ()
    """Addresses that are desired only as the context of a submission (the fleets, volumes
    and gateways its runs may name, read from state): never changed by it."""


class PlanInputs(NamedTuple):
    desired: Sequence[DesiredItem]
    state: State
    state_exists: bool
    drift: Mapping[str, str] = MappingProxyType({})
    """address -> why refresh found it gone (e.g. `jobs gone`)."""
    placements: Mapping[str, Placement] = MappingProxyType({})
    options: PlanOptions = PlanOptions()
    crashed: Mapping[str, Crash] = MappingProxyType({})
    """address -> how refresh found a run broken (its jobs failed): the plan replaces it."""
    short: Mapping[str, str] = MappingProxyType({})
    """address -> what refresh found missing (a fleet's lost machines): updated in place."""
    expired: Mapping[str, str] = MappingProxyType({})
    """address -> why a finished submitted run leaves state now (its retention ended)."""
    unsupported: Mapping[tuple[str, str], str] = MappingProxyType({})
    """(kind, provider) -> why apply cannot create or update such a resource in this version
    (the handlers say so); a plan that would is refused."""


def make_plan(inputs: PlanInputs) -> Plan:
    """The changes that make the state match the configuration, in dependency order.

    Raises PlanError for what no apply could do: unknown --target/--replace addresses, changes
    whose provider cannot make them (and their dependents), destroying protected objects.
    """
    desired = {d.address: d for d in inputs.desired}
    state = inputs.state
    options = inputs.options
    _check_known(options, desired, state)
    graph, batches = dag.build_ordered(_edges(desired, state), _node_info(desired, state))
    selected = _selected(graph, options, desired, state, inputs.expired)

    changes: list[ResourceChange] = []
    kept: list[str] = []
    for address in _ordered(batches, selected):
        current = state.get(address)
        wanted = None if options.destroy else desired.get(address)
        if wanted is None and current is not None and _kept(address, current, inputs):
            if not options.submission:
                kept.append(address)
            continue
        change = _classify(address, wanted, current, inputs)
        if change is not None:
            changes.append(_with_origin(change, current, options))
    _check_supported(changes, inputs.unsupported)
    _check_prevent_destroy(changes, inputs)
    warnings: tuple[str, ...] = ()
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
        submission=options.submission,
        kept=tuple(kept),
    )


def _edges(desired: Mapping[str, DesiredItem], state: State) -> dict[str, tuple[str, ...]]:
    edges = {a: r.depends_on for a, r in state.resources.items()}
    edges.update({a: d.depends_on for a, d in desired.items()})
    known = set(edges)
    return {a: tuple(x for x in deps if x in known) for a, deps in edges.items()}


def _node_info(desired: Mapping[str, DesiredItem], state: State) -> dict[str, dag.NodeInfo]:
    info = {a: dag.NodeInfo(r.kind, r.provider) for a, r in state.resources.items()}
    info.update({a: dag.NodeInfo(d.kind, d.provider) for a, d in desired.items()})
    return info


def _check_known(options: PlanOptions, desired: Mapping[str, Any], state: State) -> None:
    for flag, addresses in (("--target", options.targets), ("--replace", options.replace)):
        for address in addresses:
            if address not in desired and state.get(address) is None:
                hint = did_you_mean(address, [*desired, *state.resources])
                raise PlanError(
                    f"{flag} {address}: no such resource in configuration or state{hint}"
                )


def _selected(
    graph: dag.Graph,
    options: PlanOptions,
    desired: Mapping[str, Any],
    state: State,
    expired: Mapping[str, str],
) -> set[str]:
    everything = set(desired) | set(state.resources)
    if options.submission:  # what it was given (and expired runs), never its context
        everything = (set(desired) - set(options.context)) | set(expired)
    if not options.targets:
        return everything
    if options.destroy:
        return dag.with_dependents(graph, options.targets)
    return dag.with_dependencies(graph, options.targets)


def _kept(address: str, current: ResourceState, inputs: PlanInputs) -> bool:
    """Whether a resource in state that the configuration does not declare stays: always in
    a submission; in a directory plan, a submitted one unless pruned or expired."""
    options = inputs.options
    if options.destroy:
        return False
    if address in inputs.expired:
        return False
    return options.submission or (current.submitted and not options.prune)


def _with_origin(
    change: ResourceChange, current: ResourceState | None, options: PlanOptions
) -> ResourceChange:
    """`change`, saying how apply records its entry: a submission records what it creates as
    submitted (and leaves a declared entry declared); a directory plan records every resource
    its files declare as declared. A no-op says so only when that changes the record."""
    if change.action is Action.DELETE or options.destroy:
        return change
    was = current is not None and current.submitted
    becomes = options.submission and (current is None or was)
    if change.action is Action.NOOP and becomes == was:
        return change
    return replace(change, submitted=becomes)


def _ordered(batches: list[list[str]], selected: set[str]) -> list[str]:
    return [a for batch in batches for a in batch if a in selected]


class Decision(NamedTuple):
    """What happens to an address that is both desired and in state, and why."""

    action: Action
    after: dict[str, Any]
    reason: str | None = None
    action_reason: str | None = None
    changed_paths: tuple[str, ...] = ()
    replace_paths: tuple[str, ...] = ()


def _classify(
    address: str,
    wanted: DesiredItem | None,
    current: ResourceState | None,
    inputs: PlanInputs,
) -> ResourceChange | None:
    if wanted is None:
        if current is None:
            return None
        destroy = inputs.options.destroy
        return ResourceChange(
            address=address,
            kind=current.kind,
            name=current.name,
            provider=current.provider,
            action=Action.DELETE,
            before=current.spec,
            reason=_delete_reason(address, current, inputs),
            action_reason=None if destroy else "delete_because_no_resource_config",
            depends_on=current.depends_on,
        )
    if current is None:
        decision = Decision(Action.CREATE, wanted.spec)
    else:
        decision = _decide(address, wanted, current, inputs)
    return ResourceChange(
        address=address,
        kind=wanted.kind,
        name=wanted.name,
        provider=wanted.provider,
        action=decision.action,
        reason=decision.reason,
        action_reason=decision.action_reason,
        before=None if current is None else current.spec,
        after=decision.after,
        changed_paths=decision.changed_paths,
        replace_paths=decision.replace_paths,
        depends_on=wanted.depends_on,
        placement=inputs.placements.get(address),
        secrets=wanted.secrets,
    )


def _delete_reason(address: str, current: ResourceState, inputs: PlanInputs) -> str:
    if inputs.options.destroy:
        return "destroy requested"
    if address in inputs.expired:
        return inputs.expired[address]
    if current.submitted:
        return "submitted, not in configuration, and --prune given"
    return "not in configuration"


def _decide(
    address: str, wanted: DesiredItem, current: ResourceState, inputs: PlanInputs
) -> Decision:
    """The change for a resource that is in both the configuration and the state."""
    if address in inputs.drift:
        return Decision(Action.CREATE, wanted.spec, reason=f"drift: {inputs.drift[address]}")
    diff = diff_specs(wanted.kind, current.spec, wanted.spec)
    replace = _replace_action(wanted)
    if address in inputs.options.replace:
        return Decision(
            replace, diff.after, "requested with --replace", "replace_by_request", diff.changed
        )
    if current.tainted:
        reason = "tainted (a previous apply failed midway)"
        if never_created(current):
            reason = "tainted (its create did not complete: nothing was created to destroy)"
        return Decision(replace, diff.after, reason, "replace_because_tainted", diff.changed)
    crash = inputs.crashed.get(address)
    if crash is not None:
        return Decision(replace, diff.after, f"drift: {crash.reason}", None, diff.changed)
    if diff.forces_replacement:
        return Decision(
            replace,
            diff.after,
            "forces replacement: " + ", ".join(diff.forces_replacement),
            "replace_because_cannot_update",
            diff.changed,
            diff.forces_replacement,
        )
    if address in inputs.short:
        reason = f"drift: {inputs.short[address]}"
        return Decision(Action.UPDATE, diff.after, reason, None, diff.changed)
    if DEPOSED_KEY in current.attributes:
        reason = "an object left by a failed replacement (deposed) will be destroyed"
        return Decision(Action.UPDATE, diff.after, reason, None, diff.changed)
    unfinished = wanted.kind == "service" and ROLLOUT_KEY in current.attributes
    if diff.changed or unfinished:
        rolling = rolling_paths(wanted.kind, diff.changed)
        if unfinished and not rolling:
            reason = "rolling update, one replica at a time: finishing one left unfinished"
            changed = ", ".join(diff.changed)
            reason += f"; {changed}" if changed else ""
            return Decision(Action.UPDATE, diff.after, reason, ROLLING_UPDATE, diff.changed)
        if rolling:
            reason = "rolling update, one replica at a time: " + ", ".join(diff.changed)
            return Decision(Action.UPDATE, diff.after, reason, ROLLING_UPDATE, diff.changed)
        reason = "update in place: " + ", ".join(diff.changed)
        return Decision(Action.UPDATE, diff.after, reason, None, diff.changed)
    return Decision(Action.NOOP, diff.after)


def never_created(entry: ResourceState) -> bool:
    """An intent entry whose create never completed, holding no older (deposed) object: state
    records nothing that exists, so removing or replacing it destroys nothing."""
    return entry.tainted and entry.status == CREATING and DEPOSED_KEY not in entry.attributes


def _replace_action(wanted: DesiredItem) -> Action:
    if create_before_destroy(wanted.spec):
        return Action.CREATE_THEN_DELETE
    return Action.DELETE_THEN_CREATE


def _applies(action: Action) -> bool:
    """The action calls the handler to create or update an object."""
    return action in (Action.CREATE, Action.UPDATE) or action.is_replace


def _check_supported(
    changes: list[ResourceChange], unsupported: Mapping[tuple[str, str], str]
) -> None:
    """Refuse, all at once, the changes apply could not make: those whose provider cannot
    create or update their kind, and those that depend on one of them."""
    refused: dict[str, str] = {}
    for change in changes:  # in dependency order: a dependency is judged before its dependents
        if not _applies(change.action):
            continue
        blocker = next((d for d in change.depends_on if d in refused), None)
        reason = unsupported.get((change.kind, change.provider))
        if blocker is not None:
            refused[change.address] = f"depends on {blocker}, which cannot be applied"
        elif reason is not None:
            refused[change.address] = reason
    if refused:
        count = len(refused)
        lines = "\n".join(f"  {address}: {reason}" for address, reason in refused.items())
        raise PlanError(
            f"{count} resource{'s' if count > 1 else ''} cannot be applied by this version "
            f"of dstack-plan:\n{lines}\n"
            "Remove them from the configuration to plan the rest."
        )


def _check_prevent_destroy(changes: list[ResourceChange], inputs: PlanInputs) -> None:
    blocked = []
    for change in changes:
        deletes = change.action is Action.DELETE or change.action.is_replace
        if not deletes or change.address in inputs.options.allow_destroy_protected:
            continue
        if not _destroys_something(change.address, inputs):
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


def _destroys_something(address: str, inputs: PlanInputs) -> bool:
    """Whether deleting `address` would destroy an object that exists and works: not a create
    that never completed, nor a crashed run with no job left running."""
    current = inputs.state.get(address)
    if current is None or never_created(current):
        return False
    crash = inputs.crashed.get(address)
    return crash is None or crash.active


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
