"""How the CLI tunes Python's cyclic garbage collector: fewer young collections, none at exit,
and none during bulk loading."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dstack_plan.gcpause import YOUNG_COLLECTION_THRESHOLD, collect_less_often, gc_paused


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_collect_less_often_raises_only_the_young_threshold(restore_gc: None) -> None:
    gc.set_threshold(700, 11, 12)
    collect_less_often()
    assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, 11, 12)


def test_gc_paused_pauses_the_collector_and_moves_survivors_to_the_oldest_generation(
    restore_gc: None,
) -> None:
    gc.enable()
    gc.collect()
    with gc_paused():
        assert not gc.isenabled()
        survivors = [[i] for i in range(10_000)]
    assert gc.isenabled()
    assert gc.get_count()[0] < len(survivors)  # not left for the next young collection
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()  # a collector that was off stays off


PROBE = """
import atexit, gc, json, sys
# registered first, so it runs last: after the CLI's own exit handlers
atexit.register(lambda: print(json.dumps([gc.get_threshold(), gc.get_freeze_count()])))
sys.argv = ["dstack", "--help"]
from dstack_plan.cli.__main__ import main
main()
"""


def test_the_console_script_collects_less_often_and_not_at_exit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    threshold, frozen = json.loads(done.stdout.strip().splitlines()[-1])
    assert threshold[0] == YOUNG_COLLECTION_THRESHOLD
    assert frozen > 1000  # what was alive at exit was frozen, so the final collection skips it
