"""`dstack namespace list`: each namespace's limits beside what it holds and used today.

    view = namespaces_view(load_quotas(project_dir), namespace_usage(state, now))

Namespaces are those the quota file names and those runs in state use; users are those with
limits of their own and those with usage. Pure: the caller reads the quotas and the state.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from dstack_plan.config.quotas import Limits, Quotas
from dstack_plan.scheduler.quotas import Usage, UsageKey


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsView(_View):
    """Limits; null: no limit."""

    gpus: float | None = None
    gpu_hours_per_day: float | None = None
    cost_per_hour: float | None = None

    @classmethod
    def of(cls, limits: Limits | None) -> LimitsView:
        if limits is None:
            return cls()
        return cls(
            gpus=limits.gpus,
            gpu_hours_per_day=limits.gpu_hours_per_day,
            cost_per_hour=limits.cost_per_hour,
        )


class UsageView(_View):
    """GPUs held now, GPU-hours used since midnight UTC, dollars per hour of running runs."""

    gpus: float = 0.0
    gpu_hours_today: float = 0.0
    cost_per_hour: float = 0.0

    @classmethod
    def of(cls, usage: Usage | None) -> UsageView:
        usage = usage or Usage()
        return cls(
            gpus=round(usage.gpus, 4),
            gpu_hours_today=round(usage.gpu_hours_today, 4),
            cost_per_hour=round(usage.cost_per_hour, 4),
        )


class UserView(_View):
    name: str
    limits: LimitsView
    """What applies to the user: their own limits, else `per_user`."""
    own_limits: bool
    """Whether the user has limits of their own (`users:`), replacing `per_user`."""
    usage: UsageView


class NamespaceView(_View):
    name: str
    quota: bool
    """Whether the quota file has an entry for it (none: no limits)."""
    limits: LimitsView
    per_user: LimitsView | None
    usage: UsageView
    users: list[UserView]


class NamespacesView(_View):
    """What `dstack namespace list --json` prints."""

    namespaces: list[NamespaceView]


def namespaces_view(quotas: Quotas, used: Mapping[UsageKey, Usage]) -> NamespacesView:
    """Every namespace with a quota or usage, by name; in each, its users by name."""
    names = sorted(set(quotas.namespaces) | {namespace for namespace, _ in used})
    views = []
    for name in names:
        quota = quotas.for_namespace(name)
        user_names = sorted(
            set(quota.users if quota is not None else ())
            | {user for namespace, user in used if namespace == name and user is not None}
        )
        users = [
            UserView(
                name=user,
                limits=LimitsView.of(quota.for_user(user) if quota is not None else None),
                own_limits=quota is not None and user in quota.users,
                usage=UsageView.of(used.get((name, user))),
            )
            for user in user_names
        ]
        views.append(
            NamespaceView(
                name=name,
                quota=quota is not None,
                limits=LimitsView.of(quota),
                per_user=LimitsView.of(quota.per_user) if quota and quota.per_user else None,
                usage=UsageView.of(used.get((name, None))),
                users=users,
            )
        )
    return NamespacesView(namespaces=views)


HEADERS = ["NAMESPACE", "USER", "GPUS", "GPU-HOURS TODAY", "COST/H"]


def table_rows(view: NamespacesView) -> list[list[str]]:
    """The rows of the human table (without the header): `used / limit` per column, the
    used amount alone where there is no limit; the per-user row has limits only."""
    rows = []
    for namespace in view.namespaces:
        rows.append([namespace.name, "", *_cells(namespace.limits, namespace.usage)])
        if namespace.per_user is not None:
            rows.append([namespace.name, "(per user)", *_cells(namespace.per_user, None)])
        for user in namespace.users:
            name = user.name if user.own_limits else f"{user.name} (per user)"
            rows.append([namespace.name, name, *_cells(user.limits, user.usage)])
    return rows


def _cells(limits: LimitsView, usage: UsageView | None) -> list[str]:
    pairs = [
        (limits.gpus, usage.gpus if usage else None, ""),
        (limits.gpu_hours_per_day, usage.gpu_hours_today if usage else None, ""),
        (limits.cost_per_hour, usage.cost_per_hour if usage else None, "$"),
    ]
    cells = []
    for limit, used, unit in pairs:
        shown_limit = "-" if limit is None else f"{unit}{_n(limit)}"
        if used is None:
            cells.append(shown_limit)
        elif limit is None:
            cells.append(f"{unit}{_n(used)}")
        else:
            cells.append(f"{unit}{_n(used)} / {shown_limit}")
    return cells


def _n(value: float) -> str:
    rounded = round(value, 2)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:g}"
