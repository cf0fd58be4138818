"""Mapping a pure function over a list on every core, with forked worker processes.

Parsing thousands of YAML documents is CPU-bound Python; threads would take turns under the
GIL. Forked children start in a few milliseconds with everything already imported, each maps
one contiguous slice, and sends its results back pickled. The parent maps the first slice
itself meanwhile, so on one core (or for small inputs) nothing is forked at all.

Used by the config loader (`config/loader.py`, `start_loading`), whose time it serves. Kept
because it pays on an otherwise idle 2-core VM (with and without alternating in one session,
medians): without it, `benchmarks/validate_scale.py` at 10,000 resources in 1,000 files took
0.46 -> 0.54 s (+18%; a single file is never split), and `benchmarks/plan_scale.py --sizes
10000` 1.71 -> 1.93 s (+13%) for a no-op plan. It needs the other core free: measured while
other work kept that core busy, the parent waited for its starved child and the same plans were
24-28% slower with the fork than without.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def fork_map(
    func: Callable[[T], R],
    items: Sequence[T],
    weights: Sequence[int],
    *,
    min_weight: int,
    workers: int | None = None,
) -> list[R]:
    """`[func(item) for item in items]`, spread over `workers` processes (default: the cores).

    `weights` estimate each item's cost (bytes of text, say); below `min_weight` in all, or
    with one worker, everything runs here. `func` and the results must pickle. A child that
    dies or raises only costs time: its slice is mapped again in this process, so errors are
    raised here, as the serial loop would raise them.
    """
    return fork_start(func, items, weights, min_weight=min_weight, workers=workers).results()


def fork_start(
    func: Callable[[T], R],
    items: Sequence[T],
    weights: Sequence[int],
    *,
    min_weight: int,
    workers: int | None = None,
    busy: int = 0,
) -> ForkedMap[T, R]:
    """`fork_map` in two steps: the children start now, `results()` gathers everything.

    Between the two, this process may do other work; `busy` is its cost in the units of
    `weights`, so that this process keeps a smaller slice of the items (none if the other
    work alone is a fair share). Call `results()` or `cancel()` exactly once.
    """
    if len(weights) != len(items):
        raise ValueError("fork_map: one weight per item")
    count = min(workers or available_cores(), MAX_WORKERS, len(items))
    if count < 2 or sum(weights) < min_weight or not _can_fork():
        return ForkedMap(func, items, (0, len(items)), [])
    own, *others = _slices_with_own_work(weights, count, busy)
    import multiprocessing

    context = multiprocessing.get_context("fork")
    children = []
    for start, stop in others:
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=_map_slice, args=(func, items[start:stop], send), daemon=True
        )
        child.start()
        send.close()  # the child holds its own copy; EOF then means the child is gone
        children.append(_Child(child, receive, start, stop))
    return ForkedMap(func, items, own, children)


@dataclass
class _Child:
    process: Any
    receive: Any
    start: int
    stop: int


class ForkedMap(Generic[T, R]):
    """A map whose other slices are being computed by forked children."""

    def __init__(
        self,
        func: Callable[[T], R],
        items: Sequence[T],
        own: tuple[int, int],
        children: list[_Child],
    ):
        self._func = func
        self._items = items
        self._own = own
        self._children = children

    def results(self) -> list[R]:
        """Map this process's slice, then collect the children's (or redo a failed one)."""
        start, stop = self._own
        try:
            results = [self._func(item) for item in self._items[start:stop]]
        except BaseException:  # an error or Ctrl-C here: nobody will read the children
            self.cancel()
            raise
        for child in self._children:
            mapped = _collect(child.process, child.receive)
            if mapped is None:
                mapped = [self._func(item) for item in self._items[child.start : child.stop]]
            results.extend(mapped)
        return results

    def cancel(self) -> None:
        """Stop the children without waiting for their results."""
        for child in self._children:
            child.receive.close()
            child.process.terminate()
            child.process.join()


def _can_fork() -> bool:
    # fork is the only start method that costs milliseconds; it is safe on Linux for children
    # that only compute with modules already imported
    return sys.platform == "linux" and hasattr(os, "fork")


def _slices_with_own_work(weights: Sequence[int], count: int, busy: int) -> list[tuple[int, int]]:
    """`count` slices, the first (possibly empty) for this process, which also does `busy`."""
    if busy * count >= sum(weights) + busy:  # the other work alone is a fair share
        return [(0, 0), *_balanced_slices(weights, count - 1)]
    # balance as if the other work were one more item in front of this process's slice
    shifted = _balanced_slices([busy, *weights], count)
    return [(max(start - 1, 0), stop - 1) for start, stop in shifted]


def _balanced_slices(weights: Sequence[int], count: int) -> list[tuple[int, int]]:
    """`count` contiguous, non-empty index ranges of about equal total weight."""
    total = sum(weights)
    slices: list[tuple[int, int]] = []
    start, running = 0, 0
    for index, weight in enumerate(weights):
        running += weight
        remaining_slices = count - len(slices) - 1
        remaining_items = len(weights) - index - 1
        boundary = total * (len(slices) + 1) / count
        if remaining_slices and (running >= boundary or remaining_items == remaining_slices):
            slices.append((start, index + 1))
            start = index + 1
    slices.append((start, len(weights)))
    return slices


def _map_slice(func: Callable[[Any], Any], items: Sequence[Any], send: Any) -> None:
    # Ctrl-C is the parent's to handle. A child that handled it too would also write to the
    # wakeup fd it inherited from the parent's event loop: one key press counted twice.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.set_wakeup_fd(-1)
    import pickle  # noqa: PLC0415 - loaded by multiprocessing already; not needed without forks

    try:
        payload = pickle.dumps(("ok", [func(item) for item in items]), protocol=5)
    except BaseException as err:  # reported, and the parent maps the slice itself
        payload = pickle.dumps(("failed", repr(err)), protocol=5)
    try:
        send.send_bytes(payload)
        send.close()
    except OSError:
        pass  # the parent is gone or stopped listening (interrupted): nobody to tell


def _collect(child: Any, receive: Any) -> list[Any] | None:
    import pickle  # noqa: PLC0415 - loaded by multiprocessing already; not needed without forks

    try:
        status, value = pickle.loads(receive.recv_bytes())
    except (EOFError, OSError, pickle.UnpicklingError):
        status, value = "failed", None
    finally:
        receive.close()
        child.join()
    return value if status == "ok" else None
