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
from dstack_plan.runs.usage import namespace_usage, run_gpus, run_usage
from dstack_plan.runs.user import current_user
from dstack_plan.scheduler.quotas import Ask, Violation, check_asks
from dstack_plan.state.model import ResourceState, State


class QuotaHold(NoCapacity):
    """A queued or scheduled run may not start now: its namespace or user is at a limit.
    A NoCapacity, so watch keeps it waiting (with this as its `why`) as for a full fleet."""


def check_plan(
    plan: Plan, state: State, project_dir: str | Path, now: float, user: str | None = None
) -> None:
    """Raise PlanError, one line per broken limit, when the runs `plan` starts would exceed a
    quota of `.dstack/quotas.yml` on top of what `state` records (see the module docstring)."""
    quotas = load_quotas(project_dir)
    if not quotas.namespaces:
        return
    who = user or current_user()
    asks: list[Ask] = []
    released: set[str] = set()
    for change in plan.changes:
        if change.kind not in RUN_KINDS or change.action is Action.NOOP:
            continue
        if change.action is not Action.CREATE:
            released.add(change.address)  # replaced, deleted or updated: counted anew below
        ask = _ask(change, state.get(change.address), who)
        if ask is not None:
            asks.append(ask)
        elif change.action is Action.UPDATE:
            released.discard(change.address)  # it keeps what it holds, as it holds it
    violations = _violations(quotas, state, now, asks, released)
    if violations:
        raise PlanError("\n".join(v.text() for v in violations))


def hold_for_quota(project_dir: str | Path, state: State, run: ResourceState, now: float) -> None:
    """Raise QuotaHold when starting the queued or scheduled `run` now (all its jobs) would
    take its namespace or user over a limit; its own earlier jobs hold nothing any more."""
    quotas = load_quotas(project_dir)
    if not quotas.namespaces:
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
    violations = _violations(quotas, state, now, [ask], {run.address})
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
