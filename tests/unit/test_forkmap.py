"""fork_map: the same results as a plain loop, computed on several processes."""

from __future__ import annotations

import os
import signal
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstack_plan.config.forkmap import (
    _balanced_slices,
    _slices_with_own_work,
    fork_map,
    fork_start,
)

PARENT = os.getpid()


def square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def fail_on_seven(x: int) -> int:
    if x == 7:
        raise KeyError(f"item {x}")
    return x


def die_in_child(x: int) -> int:
    if os.getpid() != PARENT:
        os._exit(3)  # a crash, not an exception: nothing comes back
    return -x


def test_results_in_order_and_computed_by_several_processes() -> None:
    items = list(range(40))
    results = fork_map(square_with_pid, items, [1] * 40, min_weight=0, workers=3)
    assert [r for r, _ in results] == [x * x for x in items]
    pids = {pid for _, pid in results}
    assert len(pids) == 3 and PARENT in pids


def sigint_handler(_: int) -> object:
    return signal.getsignal(signal.SIGINT)


def test_children_leave_ctrl_c_to_the_parent() -> None:
    handlers = fork_map(sigint_handler, [0, 1], [1, 1], min_weight=0, workers=2)
    assert handlers[0] is signal.default_int_handler  # the parent's, untouched
    assert handlers[1] == signal.SIG_IGN


def test_small_inputs_stay_in_this_process() -> None:
    results = fork_map(square_with_pid, [1, 2, 3], [10, 10, 10], min_weight=31, workers=3)
    assert {pid for _, pid in results} == {PARENT}


def test_an_error_in_a_child_is_raised_here_as_the_loop_would() -> None:
    with pytest.raises(KeyError, match="item 7"):
        fork_map(fail_on_seven, list(range(10)), [1] * 10, min_weight=0, workers=2)


def test_a_child_that_dies_costs_time_not_results() -> None:
    items = list(range(12))
    assert fork_map(die_in_child, items, [1] * 12, min_weight=0, workers=3) == [-x for x in items]


def test_one_weight_per_item() -> None:
    with pytest.raises(ValueError, match="one weight per item"):
        fork_map(abs, [1, 2], [1], min_weight=0)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=60), st.integers(1, 8))
def test_slices_cover_everything_in_order_and_none_is_empty(
    weights: list[int], count: int
) -> None:
    count = min(count, len(weights))
    slices = _balanced_slices(weights, count)
    assert len(slices) == count
    assert slices[0][0] == 0 and slices[-1][1] == len(weights)
    for (_, stop), (start, _) in zip(slices, slices[1:], strict=False):
        assert stop == start
    assert all(stop > start for start, stop in slices)


def test_slices_share_the_weight_evenly() -> None:
    assert _balanced_slices([1] * 100, 4) == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert _balanced_slices([90, 5, 5, 5, 5], 2) == [(0, 1), (1, 5)]


def test_a_busy_parent_keeps_a_smaller_slice_or_none() -> None:
    assert _slices_with_own_work([1] * 9, 3, busy=0) == [(0, 3), (3, 6), (6, 9)]
    assert _slices_with_own_work([1] * 9, 3, busy=2) == [(0, 2), (2, 6), (6, 9)]
    assert _slices_with_own_work([1] * 8, 3, busy=4) == [(0, 0), (0, 4), (4, 8)]


def test_the_parent_works_between_start_and_results() -> None:
    items = list(range(30))
    pending = fork_start(square_with_pid, items, [1] * 30, min_weight=0, workers=2, busy=10)
    side_work = sum(range(1000))  # what the caller does meanwhile (reading state, say)
    results = pending.results()
    assert side_work == 499500 and [r for r, _ in results] == [x * x for x in items]
    assert [pid for _, pid in results].count(PARENT) == 10


def test_cancel_stops_the_children() -> None:
    pending = fork_start(slow_square, list(range(4)), [1] * 4, min_weight=0, workers=3)
    children = [c.process for c in pending._children]
    pending.cancel()
    assert children and all(not c.is_alive() for c in children)


def slow_square(x: int) -> int:
    time.sleep(30)
    return x * x


def fail_in_parent(x: int) -> int:
    if os.getpid() == PARENT:
        raise KeyError("parent slice")
    time.sleep(30)
    return x


def test_an_error_in_the_parents_slice_stops_the_children() -> None:
    pending = fork_start(fail_in_parent, list(range(4)), [1] * 4, min_weight=0, workers=2)
    children = [c.process for c in pending._children]
    with pytest.raises(KeyError, match="parent slice"):
        pending.results()
    assert children and all(not c.is_alive() for c in children)
