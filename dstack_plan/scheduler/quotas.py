"""Quota checks (pure): would the runs a plan starts exceed a namespace's or a user's limits,
and who has used up their daily GPU-hours?

Limits come from `dstack_plan.config.quotas` (`.dstack/quotas.yml`); usage (what each
namespace and user holds now and used today) is computed from the state by the caller.
`gpus` and `cost_per_hour` limit what is held at once: in use plus asked must not exceed
them. `gpu_hours_per_day` limits use over a UTC day: once it is used up, no run that needs
GPUs may start (a run cannot know beforehand how long it will take), and watch stops the
running jobs of whoever has gone over it (`over_daily`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from dstack_plan.config.quotas import Limits, Quotas

EPSILON = 1e-9
"""Shares are fractions (0.1 + 0.2 > 0.3 in floats): sums within this much count as equal."""
UsageKey = tuple[str, str | None]
"""(namespace, user); user None is the whole namespace."""


class Usage(NamedTuple):
    """What one namespace (or one user in it) holds or used."""

    gpus: float = 0.0
    gpu_hours_today: float = 0.0
    cost_per_hour: float = 0.0


class Ask(NamedTuple):
    """What a plan would start: one run."""

    address: str
    """The run's address, e.g. `task.train`."""
    namespace: str
    user: str
    gpus: float
    """GPUs for all its jobs (shares as fractions)."""
    cost_per_hour: float


class Violation(NamedTuple):
    """A limit the asks (or the usage alone, for a daily limit) break."""

    namespace: str
    user: str | None
    """None: the namespace's own limit."""
    limit: str
    """`gpus`, `gpu_hours_per_day` or `cost_per_hour`."""
    allowed: float
    used: float
    """In use (or used today) before the asks."""
    asked: float
    """What the asks add (0 for a daily limit already used up)."""
    addresses: tuple[str, ...]
    """The runs that ask (none for `over_daily`)."""
    project: str | None = None
    """Set for another project's limit on this one's exported fleets (`check_project`):
    then `namespace` and `user` are unused."""

    def text(self) -> str:
        """One line naming the namespace (and user), the limit and the amounts, e.g.
        `namespace dev: gpus limit 20, 18 in use, task.train asks 4`."""
        who = f"namespace {self.namespace}"
        if self.project is not None:
            who = f"project {self.project}"
        elif self.user is not None:
            who += f", user {self.user}"
        runs = ", ".join(self.addresses)
        verb = "asks" if len(self.addresses) == 1 else "ask"
        if self.limit == "gpu_hours_per_day":
            text = f"{who}: gpu_hours_per_day limit {_n(self.allowed)}, {_n(self.used)} used today"
            if runs:
                text += f"; {runs} cannot start until the next UTC day"
            return text
        money = "$" if self.limit == "cost_per_hour" else ""
        text = (
            f"{who}: {self.limit} limit {money}{_n(self.allowed)}, {money}{_n(self.used)} in use"
        )
        if runs:
            text += f", {runs} {verb} {money}{_n(self.asked)}"
        return text


def _n(value: float) -> str:
    """A number as a person writes it: 20, 0.5, 24.5, 1.33."""
    rounded = round(value, 2)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:g}"


def check_asks(
    quotas: Quotas, usage: Mapping[UsageKey, Usage], asks: Sequence[Ask]
) -> list[Violation]:
    """Every limit the `asks`, started on top of `usage`, would break: the namespaces' own
    limits and each user's (`users[user]` if the namespace lists the user, else `per_user`).

    Ordered by namespace, the namespace's own limits before its users', users by name, limits
    in the order `gpus`, `gpu_hours_per_day`, `cost_per_hour`; addresses in the order asked.
    """
    groups: dict[UsageKey, list[Ask]] = {}
    for ask in asks:
        groups.setdefault((ask.namespace, None), []).append(ask)
        groups.setdefault((ask.namespace, ask.user), []).append(ask)
    violations: list[Violation] = []
    for key in sorted(groups, key=_order):
        limits = _limits(quotas, key)
        if limits is not None:
            violations.extend(_check(key, limits, usage.get(key, Usage()), groups[key]))
    return violations


def over_daily(quotas: Quotas, usage: Mapping[UsageKey, Usage]) -> list[Violation]:
    """The namespaces and users whose GPU-hours today exceed their daily limit (watch stops
    their running jobs), in the order of `check_asks`."""
    violations = []
    for key in sorted(usage, key=_order):
        limits = _limits(quotas, key)
        allowed = limits.gpu_hours_per_day if limits is not None else None
        used = usage[key].gpu_hours_today
        if allowed is not None and used > allowed + EPSILON:
            violations.append(Violation(*key, "gpu_hours_per_day", allowed, used, 0.0, ()))
    return violations


def check_project(
    project: str, limits: Limits, used: Usage, asks: Sequence[Ask]
) -> list[Violation]:
    """Every limit of an importer project (`Quotas.projects`, published by the owner) that
    `asks` would break on top of what the project `used` of the owner's fleets."""
    return [v._replace(project=project) for v in _check(("", None), limits, used, list(asks))]


def project_over_daily(project: str, limits: Limits, used: Usage) -> Violation | None:
    """The project's daily GPU-hours limit, when its runs on the owner's fleets went over
    it today (the owner's watch stops their GPU jobs)."""
    allowed = limits.gpu_hours_per_day
    if allowed is None or used.gpu_hours_today <= allowed + EPSILON:
        return None
    return Violation(
        "", None, "gpu_hours_per_day", allowed, used.gpu_hours_today, 0.0, (), project
    )


def _order(key: UsageKey) -> tuple[str, bool, str]:
    namespace, user = key
    return (namespace, user is not None, user or "")


def _limits(quotas: Quotas, key: UsageKey) -> Limits | None:
    namespace, user = key
    quota = quotas.for_namespace(namespace)
    if quota is None:
        return None
    return quota if user is None else quota.for_user(user)


def _check(key: UsageKey, limits: Limits, used: Usage, asks: list[Ask]) -> list[Violation]:
    found = _held(key, "gpus", limits.gpus, used.gpus, [(a.address, a.gpus) for a in asks])
    allowed = limits.gpu_hours_per_day
    starting = tuple(a.address for a in asks if a.gpus > EPSILON)
    if allowed is not None and starting and used.gpu_hours_today >= allowed - EPSILON:
        found.append(
            Violation(*key, "gpu_hours_per_day", allowed, used.gpu_hours_today, 0.0, starting)
        )
    costs = [(a.address, a.cost_per_hour) for a in asks]
    found += _held(key, "cost_per_hour", limits.cost_per_hour, used.cost_per_hour, costs)
    return found


def _held(
    key: UsageKey, limit: str, allowed: float | None, used: float, asks: list[tuple[str, float]]
) -> list[Violation]:
    """A limit on what is held at once: in use plus asked must not exceed it."""
    asking = [(address, amount) for address, amount in asks if amount > EPSILON]
    if allowed is None or not asking:
        return []  # asking nothing more is allowed even where a lowered limit is exceeded
    asked = sum(amount for _, amount in asking)
    if used + asked <= allowed + EPSILON:
        return []
    return [Violation(*key, limit, allowed, used, asked, tuple(a for a, _ in asking))]
