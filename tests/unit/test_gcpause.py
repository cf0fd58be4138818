"""How the CLI tunes Python's cyclic garbage collector: none during bulk loading and planning,
none at exit (what the start-up review kept: see docs/graph.md)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dstack_plan.config.gcpause import gc_paused


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


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
was = gc.get_threshold()
atexit.register(
    lambda: print(json.dumps([was == gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()]))
)
sys.argv = ["dstack", "--help"]
from dstack_plan.cli.__main__ import main
main()
"""


def test_the_console_script_spares_the_exit_collection_and_leaves_the_rest_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    same_threshold, frozen, enabled = json.loads(done.stdout.strip().splitlines()[-1])
    assert same_threshold  # Python's own thresholds
    assert enabled  # no start-up pause: the review measured it within 10% (docs/graph.md)
    assert frozen > 1000  # what was alive at exit was frozen, so the final collection skips it
