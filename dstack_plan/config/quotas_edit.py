"""The edits `dstack namespace` makes to the quota file, and the `KEY=VALUE` limits it takes.

Each edit is a function of the file's round-trip data (see `quotas.save_quotas`), so a user's
comments and layout survive it; the result is validated before it is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dstack_plan.config.base import NAME_PATTERN
from dstack_plan.config.quotas import LIMIT_NAMES, QUOTAS_FILE, QuotasEdit, check_user
from dstack_plan.errors import DstackPlanError

ALIASES = {"gpu": "gpus", "gpu_hours": "gpu_hours_per_day", "cost": "cost_per_hour"}
"""Short names the options also take (`--quota gpu=20`, as the brief's example writes it)."""
NO_LIMIT = ("none", "unlimited")
"""Values that remove a limit."""
LimitValues = dict[str, float | None]
"""Limit name -> amount; None removes the limit."""


def parse_limits(items: Sequence[str], option: str) -> LimitValues:
    """`["gpu=20", "cost_per_hour=none"]` as `{"gpus": 20, "cost_per_hour": None}`;
    DstackPlanError naming `option` and the item for anything else."""
    known = ", ".join(LIMIT_NAMES)
    values: LimitValues = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_").lower()
        name = ALIASES.get(key, key)
        if not sep or not text.strip():
            raise DstackPlanError(f"{option} {item!r}: expected KEY=VALUE, e.g. gpus=20")
        if name not in LIMIT_NAMES:
            raise DstackPlanError(f"{option} {item!r}: unknown limit {key!r} (one of: {known})")
        if name in values:
            raise DstackPlanError(f"{option} {item!r}: {name} is given twice")
        values[name] = _amount(text.strip(), option, item)
    return values


def _amount(text: str, option: str, item: str) -> float | None:
    if text.lower() in NO_LIMIT:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise DstackPlanError(
            f"{option} {item!r}: expected a number >= 0 (0 allows none) or 'none' (no limit)"
        )
    return int(value) if value.is_integer() else value


def check_namespace(name: str) -> str:
    """`name` if it can name a namespace (as any resource name); else DstackPlanError."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise DstackPlanError(
            f"invalid namespace name {name!r}: use 2-41 characters, lowercase letters, digits "
            "and '-', starting with a letter"
        )
    return name


def create_namespace(name: str, limits: LimitValues) -> QuotasEdit:
    """Add namespace `name` with `limits`; an error if it has an entry already."""
    check_namespace(name)

    def edit(data: Any) -> None:
        namespaces = data["namespaces"]
        if name in namespaces:
            raise DstackPlanError(
                f"namespace {name!r} exists already in {QUOTAS_FILE}: "
                f"use `dstack namespace set {name}` to change its limits"
            )
        namespaces[name] = _mapping({})
        _update(namespaces[name], limits)

    return edit


def set_limits(
    name: str, limits: LimitValues, user: str | None = None, per_user: bool = False
) -> QuotasEdit:
    """Change the limits of namespace `name` (an error if it has no entry): its own, those of
    `user`, or (`per_user`) those every user without limits of their own gets."""
    check_namespace(name)
    if user is not None:
        _checked_user(user)

    def edit(data: Any) -> None:
        _update(_limits_of(_namespace(data, name), user, per_user), limits)

    return edit


def clear_limits(name: str, user: str | None = None) -> QuotasEdit:
    """Remove the own limits of `user` in namespace `name` (they get `per_user` again), or,
    with no user, `per_user` itself."""
    check_namespace(name)

    def edit(data: Any) -> None:
        quota = _namespace(data, name)
        if user is None:
            quota.pop("per_user", None)
            return
        users = quota.get("users")
        if isinstance(users, dict):
            users.pop(user, None)
            if not users:
                del quota["users"]

    return edit


def delete_namespace(name: str) -> QuotasEdit:
    """Remove namespace `name`'s entry (its runs then have no limits); an error if none."""
    check_namespace(name)

    def edit(data: Any) -> None:
        _namespace(data, name)
        del data["namespaces"][name]

    return edit


def _checked_user(user: str) -> str:
    try:
        return check_user(user)
    except ValueError as e:
        raise DstackPlanError(str(e)) from None


def _namespace(data: Any, name: str) -> Any:
    quota = data["namespaces"].get(name)
    if name not in data["namespaces"]:
        raise DstackPlanError(
            f"no namespace {name!r} in {QUOTAS_FILE}: create it with "
            f"`dstack namespace create {name}`"
        )
    if quota is None:  # `dev:` alone, which the file refuses; an edit gives it a mapping
        quota = data["namespaces"][name] = _mapping({})
    return quota


def _limits_of(quota: Any, user: str | None, per_user: bool) -> Any:
    if user is None and not per_user:
        return quota
    if user is None:
        if quota.get("per_user") is None:
            quota["per_user"] = _mapping({})
        return quota["per_user"]
    if quota.get("users") is None:
        quota["users"] = _mapping({})
    if quota["users"].get(user) is None:
        quota["users"][user] = _mapping({})
    return quota["users"][user]


def _update(target: Any, limits: Mapping[str, float | None]) -> None:
    for key, value in limits.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value


def _mapping(entry: dict[str, Any]) -> Any:
    from ruamel.yaml.comments import CommentedMap  # noqa: PLC0415 - only edits need it

    return CommentedMap(entry)
