"""The autoscaler's rules: replicas for the request rate, delays from the last change, scale
to and from zero, and the count an apply keeps."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.config.runs import ServiceSpec
from dstack_plan.config.service_fields import Scaling
from dstack_plan.runs.scaling import SCALING_KEY, kept_replicas
from dstack_plan.watch.scaling_decision import Decision, Load, decide

SCALING = Scaling(target=10, window=60, scale_up_delay=30, scale_down_delay=120)
NOW = 10_000.0


def load(rps: float, in_flight: int = 0, observed_for: float = 3600) -> Load:
    return Load(rps=rps, in_flight=in_flight, observed_for=observed_for)


@pytest.mark.parametrize(
    ("rps", "expected"),
    [(0.0, 1), (10.0, 1), (10.5, 2), (30.0, 3), (400.0, 4)],
)
def test_the_rate_asks_for_rps_over_target_replicas_within_the_range(
    rps: float, expected: int
) -> None:
    decision = decide(SCALING, (1, 4), expected, load(rps), scaled_at=0, now=NOW)
    assert decision == Decision(expected, expected)


def test_scaling_up_waits_scale_up_delay_from_the_last_change() -> None:
    held = decide(SCALING, (1, 4), 1, load(35), scaled_at=NOW - 10, now=NOW)
    assert held == Decision(1, 4, "scale_up_delay", NOW + 20)
    done = decide(SCALING, (1, 4), 1, load(35), scaled_at=NOW - 30, now=NOW)
    assert done == Decision(4, 4)


def test_scaling_down_waits_scale_down_delay_from_the_last_change() -> None:
    held = decide(SCALING, (1, 4), 3, load(5), scaled_at=NOW - 100, now=NOW)
    assert held == Decision(3, 1, "scale_down_delay", NOW + 20)
    assert decide(SCALING, (1, 4), 3, load(5), scaled_at=NOW - 120, now=NOW) == Decision(1, 1)


def test_no_scale_down_before_one_window_was_counted() -> None:
    # a watch that just started has seen no requests yet: that is not a rate of zero
    held = decide(SCALING, (0, 4), 2, load(0, observed_for=20), scaled_at=0, now=NOW)
    assert held == Decision(2, 0, "window", NOW + 40)


def test_from_zero_a_waiting_request_starts_a_replica_at_once() -> None:
    decision = decide(SCALING, (0, 4), 0, load(0, in_flight=1), scaled_at=NOW - 1, now=NOW)
    assert decision == Decision(1, 1)


def test_to_zero_when_idle_and_the_range_allows_it() -> None:
    decision = decide(SCALING, (0, 4), 1, load(0), scaled_at=NOW - 600, now=NOW)
    assert decision == Decision(0, 0)
    in_use = decide(SCALING, (0, 4), 1, load(0, in_flight=2), scaled_at=NOW - 600, now=NOW)
    assert in_use == Decision(1, 1)  # a request in flight keeps its replica


def service(replicas: str, scaling: bool = True) -> ServiceSpec:
    data: dict[str, Any] = {
        "type": "service",
        "name": "web",
        "commands": ["python3 -m http.server 8000"],
        "port": 8000,
        "replicas": replicas,
    }
    if scaling:
        data["scaling"] = {"metric": "rps", "target": 10}
    return ServiceSpec.model_validate(data)


def test_an_apply_keeps_the_autoscaler_count_within_the_new_range() -> None:
    scaled = {SCALING_KEY: {"desired": 3, "wanted": 3, "rps": 25.0, "scaled_at": 1.0}}
    assert kept_replicas(service("1..4"), scaled) == 3
    assert kept_replicas(service("1..2"), scaled) == 2  # the range shrank under it
    assert kept_replicas(service("4..6"), scaled) == 4
    assert kept_replicas(service("1..4"), {}) == 1  # never scaled: the minimum
    assert kept_replicas(service("0..4"), {}) == 1  # starts with one, as dstack does
    assert kept_replicas(service("2", scaling=False), scaled) == 2  # not autoscaled
