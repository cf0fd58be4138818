"""The pure quota checks: `check_asks` (plan time) and `over_daily` (watch)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from dstack_plan.config.quotas import Limits, NamespaceQuota, Quotas, parse_quotas
from dstack_plan.scheduler.quotas import (
    Ask,
    Usage,
    UsageKey,
    Violation,
    check_asks,
    over_daily,
)

QUOTAS = parse_quotas(
    """\
namespaces:
  dev:
    gpus: 20
    gpu_hours_per_day: 100
    per_user: {gpus: 4, gpu_hours_per_day: 24}
    users:
      alice: {gpu_hours_per_day: 48}
  prod: {gpus: 50, cost_per_hour: 200}
  frozen: {gpus: 0}
"""
)


def ask(address: str, gpus: float, ns: str = "dev", user: str = "bob", cost: float = 0.0) -> Ask:
    return Ask(address, ns, user, gpus, cost)


def test_within_every_limit_nothing_is_reported() -> None:
    usage: dict[UsageKey, Usage] = {("dev", None): Usage(gpus=10), ("dev", "bob"): Usage(gpus=1)}
    assert check_asks(QUOTAS, usage, [ask("task.a", 3)]) == []


def test_the_namespace_gpu_limit_names_used_and_asked() -> None:
    usage: dict[UsageKey, Usage] = {("dev", None): Usage(gpus=18)}
    asks = [ask("task.train", 2, user="u1"), ask("task.eval", 2, user="u2")]
    assert check_asks(QUOTAS, usage, asks) == [
        Violation("dev", None, "gpus", 20, 18, 4, ("task.train", "task.eval"))
    ]
    only = check_asks(QUOTAS, usage, asks[:1])
    assert only == []  # 18 + 2 is exactly the limit: allowed


def test_the_texts_name_namespace_limit_and_amounts() -> None:
    usage: dict[UsageKey, Usage] = {("dev", None): Usage(gpus=18)}
    (violation,) = check_asks(QUOTAS, usage, [ask("task.train", 4, user="carol")])
    assert violation.text() == "namespace dev: gpus limit 20, 18 in use, task.train asks 4"
    daily = Violation("dev", "alice", "gpu_hours_per_day", 24, 24.5, 0, ())
    assert daily.text() == "namespace dev, user alice: gpu_hours_per_day limit 24, 24.5 used today"
    cost = Violation("prod", None, "cost_per_hour", 200, 150.25, 60, ("task.a", "task.b"))
    assert cost.text() == (
        "namespace prod: cost_per_hour limit $200, $150.25 in use, task.a, task.b ask $60"
    )
    starting = Violation("dev", None, "gpu_hours_per_day", 100, 100, 0, ("task.a",))
    assert starting.text() == (
        "namespace dev: gpu_hours_per_day limit 100, 100 used today; "
        "task.a cannot start until the next UTC day"
    )


def test_per_user_limits_apply_to_users_without_their_own() -> None:
    usage: dict[UsageKey, Usage] = {("dev", "bob"): Usage(gpus=3)}
    assert check_asks(QUOTAS, usage, [ask("task.a", 2)]) == [
        Violation("dev", "bob", "gpus", 4, 3, 2, ("task.a",))
    ]
    # alice's own limits replace per_user: she has no gpus limit of her own
    assert check_asks(QUOTAS, {}, [ask("task.a", 6, user="alice")]) == []


def test_a_users_asks_add_up() -> None:
    asks = [ask("task.a", 2), ask("task.b", 3), ask("task.c", 1, user="carol")]
    assert check_asks(QUOTAS, {}, asks) == [
        Violation("dev", "bob", "gpus", 4, 0, 5, ("task.a", "task.b"))
    ]


def test_a_used_up_daily_limit_stops_starts_that_need_gpus() -> None:
    usage: dict[UsageKey, Usage] = {("dev", None): Usage(gpu_hours_today=100.0)}
    found = check_asks(QUOTAS, usage, [ask("task.a", 1), ask("service.web", 0)])
    assert found == [Violation("dev", None, "gpu_hours_per_day", 100, 100, 0, ("task.a",))]
    assert check_asks(QUOTAS, usage, [ask("service.web", 0)]) == []  # no GPUs: may start
    below: dict[UsageKey, Usage] = {("dev", None): Usage(gpu_hours_today=99.5)}
    assert check_asks(QUOTAS, below, [ask("task.a", 4)]) == []


def test_a_users_daily_limit_is_their_own_or_per_user() -> None:
    usage: dict[UsageKey, Usage] = {
        ("dev", "alice"): Usage(gpu_hours_today=30),
        ("dev", "bob"): Usage(gpu_hours_today=30),
    }
    found = check_asks(QUOTAS, usage, [ask("task.a", 1, user="alice"), ask("task.b", 1)])
    assert found == [Violation("dev", "bob", "gpu_hours_per_day", 24, 30, 0, ("task.b",))]


def test_cost_per_hour_sums_what_runs_and_what_is_asked() -> None:
    usage: dict[UsageKey, Usage] = {("prod", None): Usage(cost_per_hour=150)}
    asks = [ask("task.a", 1, ns="prod", cost=30), ask("task.b", 1, ns="prod", cost=30)]
    assert check_asks(QUOTAS, usage, asks) == [
        Violation("prod", None, "cost_per_hour", 200, 150, 60, ("task.a", "task.b"))
    ]
    assert check_asks(QUOTAS, usage, asks[:1]) == []


def test_shares_count_as_fractions_without_float_drift() -> None:
    quotas = Quotas(namespaces={"inf": NamespaceQuota(gpus=0.3)})
    asks = [ask("service.a", 0.1, ns="inf"), ask("service.b", 0.2, ns="inf")]
    assert check_asks(quotas, {}, asks) == []  # 0.1 + 0.2 is 0.30000000000000004
    usage: dict[UsageKey, Usage] = {("inf", None): Usage(gpus=0.25)}
    assert check_asks(quotas, usage, asks[1:]) == [
        Violation("inf", None, "gpus", 0.3, 0.25, 0.2, ("service.b",))
    ]


def test_a_zero_limit_allows_none_but_asks_of_nothing_pass() -> None:
    assert check_asks(QUOTAS, {}, [ask("task.a", 0.25, ns="frozen")]) == [
        Violation("frozen", None, "gpus", 0, 0, 0.25, ("task.a",))
    ]
    assert check_asks(QUOTAS, {}, [ask("task.cpu", 0, ns="frozen")]) == []
    zero_daily = Quotas(namespaces={"dev": NamespaceQuota(gpu_hours_per_day=0)})
    assert check_asks(zero_daily, {}, [ask("task.a", 1)]) == [
        Violation("dev", None, "gpu_hours_per_day", 0, 0, 0, ("task.a",))
    ]


def test_a_namespace_already_over_a_lowered_limit_still_starts_runs_without_gpus() -> None:
    usage: dict[UsageKey, Usage] = {("dev", None): Usage(gpus=25)}
    assert check_asks(QUOTAS, usage, [ask("task.cpu", 0)]) == []


def test_namespaces_without_a_quota_are_unlimited() -> None:
    asks = [ask("task.a", 1000, ns="default", cost=1e6), ask("task.b", 1000, ns="qa")]
    assert check_asks(QUOTAS, {("default", None): Usage(gpus=1e6)}, asks) == []


def test_order_is_namespace_then_users_then_limits_whatever_the_input_order() -> None:
    quotas = Quotas(
        namespaces={
            "a-ns": NamespaceQuota(gpus=1, cost_per_hour=1, per_user=Limits(gpus=1)),
            "b-ns": NamespaceQuota(gpus=1),
        }
    )
    usage: dict[UsageKey, Usage] = {("a-ns", None): Usage(gpu_hours_today=5)}
    asks = [
        ask("task.z", 2, ns="b-ns", user="zed"),
        ask("task.y", 2, ns="a-ns", user="yan", cost=2),
        ask("task.x", 2, ns="a-ns", user="xia", cost=2),
    ]
    expected = [
        ("a-ns", None, "gpus"),
        ("a-ns", None, "cost_per_hour"),
        ("a-ns", "xia", "gpus"),
        ("a-ns", "yan", "gpus"),
        ("b-ns", None, "gpus"),
    ]
    for seed in range(5):
        shuffled = asks[:]
        random.Random(seed).shuffle(shuffled)
        found = check_asks(quotas, usage, shuffled)
        assert [(v.namespace, v.user, v.limit) for v in found] == expected


def test_over_daily_names_whoever_exceeds_their_daily_limit() -> None:
    usage: dict[UsageKey, Usage] = {
        ("prod", None): Usage(gpu_hours_today=1e5),  # no daily limit
        ("dev", "bob"): Usage(gpu_hours_today=24.0),  # at the limit: not over
        ("dev", "alice"): Usage(gpu_hours_today=48.5),
        ("dev", None): Usage(gpu_hours_today=101),
        ("dev", "carol"): Usage(gpu_hours_today=25),
        ("qa", None): Usage(gpu_hours_today=1e5),
    }
    assert over_daily(QUOTAS, usage) == [
        Violation("dev", None, "gpu_hours_per_day", 100, 101, 0, ()),
        Violation("dev", "alice", "gpu_hours_per_day", 48, 48.5, 0, ()),
        Violation("dev", "carol", "gpu_hours_per_day", 24, 25, 0, ()),
    ]


amounts = st.floats(min_value=0, max_value=64, allow_nan=False)


@given(
    limit=amounts,
    used=amounts,
    gpus=st.lists(amounts, min_size=1, max_size=6),
)
def test_reported_gpus_exceed_the_limit_and_unreported_ones_fit(
    limit: float, used: float, gpus: list[float]
) -> None:
    quotas = Quotas(namespaces={"dev": NamespaceQuota(gpus=limit)})
    asks = [ask(f"task.t{i}", g, user=f"u{i}") for i, g in enumerate(gpus)]
    found = check_asks(quotas, {("dev", None): Usage(gpus=used)}, asks)
    asked = sum(g for g in gpus if g > 1e-9)
    if found:
        (violation,) = found
        assert violation.used + violation.asked > limit
        assert violation.asked == asked
    else:
        assert used + asked <= limit + 1e-9 or asked == 0
