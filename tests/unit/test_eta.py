"""When a waiting run may start: max_durations of what runs, and the queue ahead."""

from __future__ import annotations

from dstack_plan.scheduler.eta import UNKNOWN, Ahead, Estimate, Freeing, earliest_start

NOW = 1_000.0


def test_a_run_starts_when_enough_gpus_of_one_host_end() -> None:
    freeing = [Freeing("a", 1, NOW + 600), Freeing("a", 1, NOW + 300), Freeing("b", 2, NOW + 900)]
    # two GPUs: host a has both back at +600, before b's at +900
    assert earliest_start(2, {"a": 0, "b": 0}, freeing, (), NOW) == Estimate(NOW + 600, "")
    assert earliest_start(1, {"a": 0, "b": 0}, freeing, (), NOW) == Estimate(NOW + 300, "")
    assert earliest_start(1, {"a": 1, "b": 0}, freeing, (), NOW) == Estimate(NOW, "")


def test_the_queue_ahead_is_served_first() -> None:
    freeing = [Freeing("a", 1, NOW + 100)]
    ahead = [Ahead(1, 500.0)]  # takes the GPU at +100 and holds it 500 s
    assert earliest_start(1, {"a": 0}, freeing, ahead, NOW) == Estimate(NOW + 600, "")
    forever = [Ahead(1, None)]
    assert earliest_start(1, {"a": 0}, freeing, forever, NOW) == Estimate(None, UNKNOWN)


def test_a_job_without_max_duration_makes_the_start_unknown() -> None:
    freeing = [Freeing("a", 1, None), Freeing("b", 1, NOW + 60)]
    assert earliest_start(1, {"a": 0, "b": 0}, freeing, (), NOW) == Estimate(NOW + 60, "")
    assert earliest_start(2, {"a": 0, "b": 0}, freeing, (), NOW) == Estimate(
        None, "unknown: the hosts never free that much"
    )
    assert earliest_start(1, {"a": 0}, freeing, (), NOW) == Estimate(None, UNKNOWN)


def test_what_ends_and_starts_at_one_moment_counts_together() -> None:
    freeing = [Freeing("a", 1, NOW + 100)]
    ahead = [Ahead(1, 100.0)]  # starts at +100, ends at +200: the GPU is ours then
    assert earliest_start(1, {"a": 0}, freeing, ahead, NOW) == Estimate(NOW + 200, "")
