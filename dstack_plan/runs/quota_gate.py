"""Quotas at the door: a plan (or a saved plan applied later) that would take a namespace or a
user over a limit is refused, and watch keeps a queued or scheduled run waiting while its
start would.

What a plan asks: for each run it starts (a create or a replace, and a service scaled up), the
GPUs of all its jobs and its price per hour, counted against the namespace of its
configuration and the user who applies (`apply.user.current_user`). A run the plan replaces
or deletes holds nothing any more (its GPUs and cost are not counted; what it used today is).
A scheduled task asks nothing at plan time: it holds nothing until its cron fires, and watch
checks it then. Runs the plan keeps as they are ask nothing, so lowering a limit never
refuses a plan that starts nothing. No quota file: nothing is read or computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.quotas import Quotas, load_quotas, namespace_of
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.errors import PlanError
from dstack_plan.plan.model import Action, Plan, ResourceChange
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.runs.queueing import NoCapacity, scheduled
from dstack_plan.runs.records import RunRecord
from dstack_plan.runs.usage import namespace_usage, run_gpus, run_usage, usage_on
from dstack_plan.runs.user import current_user
from dstack_plan.scheduler.quotas import Ask, Violation, check_asks, check_project
from dstack_plan.sharing.imports import SEPARATOR, Imports, is_imported
from dstack_plan.sharing.policy import limits_for
from dstack_plan.state.model import ResourceState, State


class QuotaHold(NoCapacity):
    """A queued or scheduled run may not start now: its namespace or user is at a limit.
    A NoCapacity, so watch keeps it waiting (with this as its `why`) as for a full fleet."""


def check_plan(
    plan: Plan,
    state: State,
    project_dir: str | Path,
    now: float,
    user: str | None = None,
    imports: Imports | None = None,
) -> None:
    """Raise PlanError, one line per broken limit, when the runs `plan` starts would exceed a
    quota of `.dstack/quotas.yml` on top of what `state` records (see the module docstring),
    or, on another project's fleet, the limits that project published for this one."""
    quotas = load_quotas(project_dir)
    on_imported = imports is not None and any(
        c.placement is not None and is_imported(c.placement.fleet) for c in plan.changes
    )
    if not quotas.namespaces and not on_imported:
        return  # nothing limits this plan: no run is looked at
    who = user or current_user()
    asks: list[Ask] = []
    fleets: dict[str, str] = {}  # address -> the fleet a run that asks goes to
    released: set[str] = set()
    for change in plan.changes:
        if change.kind not in RUN_KINDS or change.action is Action.NOOP:
            continue
        if change.action is not Action.CREATE:
            released.add(change.address)  # replaced, deleted or updated: counted anew below
        ask = _ask(change, state.get(change.address), who)
        if ask is not None:
            asks.append(ask)
            fleets[change.address] = change.placement.fleet if change.placement else ""
        elif change.action is Action.UPDATE:
            released.discard(change.address)  # it keeps what it holds, as it holds it
    violations = _violations(quotas, state, now, asks, released) if quotas.namespaces else []
    if imports is not None and on_imported:
        violations += _owners_limits(imports, state, now, asks, fleets, released)
    if violations:
        raise PlanError("\n".join(v.text() for v in violations))


def _owners_limits(
    imports: Imports,
    state: State,
    now: float,
    asks: list[Ask],
    fleets: dict[str, str],
    released: set[str],
) -> list[Violation]:
    """The limits each owner published for this project that the asks on its fleets break,
    on top of what this project's runs hold and used there."""
    by_owner: dict[str, list[Ask]] = {}
    for ask in asks:
        fleet = fleets.get(ask.address, "")
        if is_imported(fleet):
            by_owner.setdefault(fleet.partition(SEPARATOR)[0], []).append(ask)
    found: list[Violation] = []
    for owner, owner_asks in sorted(by_owner.items()):
        limits = limits_for(owner, imports.state_of(owner), imports.project)
        if limits is None:
            continue
        used = usage_on(state, now, owner, released=released)
        found += check_project(imports.project, limits, used, owner_asks)
    return found


def hold_for_quota(
    project_dir: str | Path,
    state: State,
    run: ResourceState,
    now: float,
    imports: Imports | None = None,
) -> None:
    """Raise QuotaHold when starting the queued or scheduled `run` now (all its jobs) would
    take its namespace or user over a limit, or, on another project's fleet, this project over
    the limits that project published; its own earlier jobs hold nothing any more."""
    quotas = load_quotas(project_dir)
    fleet = RunRecord.of(run).fleet
    if not quotas.namespaces and (imports is None or not is_imported(fleet)):
        return
    spec = _spec(run.kind, run.spec)
    record = RunRecord.of(run)
    ask = Ask(
        address=run.address,
        namespace=namespace_of(run.spec),
        user=record.user or current_user(),
        gpus=run_gpus(spec),
        cost_per_hour=record.price_per_hour,
    )
    violations = _violations(quotas, state, now, [ask], {run.address}) if quotas.namespaces else []
    if imports is not None:
        fleets = {run.address: fleet}
        violations += _owners_limits(imports, state, now, [ask], fleets, {run.address})
    if violations:
        why = "; ".join(v.text() for v in violations)
        raise QuotaHold(record.fleet, f"over quota: {why}", run.address)


def _violations(
    quotas: Quotas, state: State, now: float, asks: list[Ask], released: Iterable[str]
) -> list[Violation]:
    if not asks:
        return []
    return check_asks(quotas, namespace_usage(state, now, released=set(released)), asks)


def _ask(change: ResourceChange, current: ResourceState | None, user: str) -> Ask | None:
    """What `change` asks for; None when it starts nothing (a delete, a scheduled task, a
    service scaled down or changed in place)."""
    if change.after is None:
        return None
    spec = _spec(change.kind, change.after)
    if scheduled(spec):
        return None
    gpus = run_gpus(spec)
    price = change.placement.price_per_hour if change.placement else 0.0
    if change.action is Action.UPDATE:
        if not isinstance(spec, ServiceSpec) or current is None:
            return None  # only a service's update submits jobs (its new replicas)
        if gpus <= _held(current):
            return None
        price = RunRecord.of(current).price_per_hour  # an update keeps the run's price
    return Ask(change.address, namespace_of(change.after), user, gpus, price)


def _held(run: ResourceState) -> float:
    """GPUs the run's unfinished jobs hold, as usage counts them."""
    return run_usage(run, 0.0).gpus


def _spec(kind: str, normalized: dict[str, Any]) -> RunSpec:
    spec = spec_from_normalized(kind, normalized)
    assert isinstance(spec, RunSpec)
    return spec
