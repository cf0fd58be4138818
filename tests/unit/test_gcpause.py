"""How the CLI tunes Python's cyclic garbage collector: fewer young collections, none at exit,
and none during bulk loading."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstack_plan.cli.common import run_with
from dstack_plan.gcpause import (
    YOUNG_COLLECTION_THRESHOLD,
    collect_less_often,
    gc_paused,
    pause_for_startup,
    resume_after_startup,
)
from dstack_plan.project import Project


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


def test_startup_pause_lasts_until_the_work_begins_and_spares_startup_objects(
    restore_gc: None, tmp_path: Path
) -> None:
    gc.enable()
    pause_for_startup()
    assert not gc.isenabled()
    startup_objects = [[i] for i in range(1_000)]
    frozen_before = gc.get_freeze_count()

    async def collector_state(project: Project) -> bool:
        return gc.isenabled()

    assert run_with(Project(tmp_path, ()), collector_state) is True
    assert gc.get_freeze_count() >= frozen_before + len(startup_objects)
    gc.unfreeze()


def test_resuming_without_a_startup_pause_leaves_the_collector_alone(restore_gc: None) -> None:
    gc.disable()  # e.g. a caller that manages the collector itself
    resume_after_startup()
    assert not gc.isenabled()
    gc.enable()
    pause_for_startup()
    resume_after_startup()
    resume_after_startup()  # a second resume (a command running two loops) changes nothing
    assert gc.isenabled()
    gc.unfreeze()


PROBE = """
import atexit, gc, json, sys
# registered first, so it runs last: after the CLI's own exit handlers
atexit.register(
    lambda: print(json.dumps([gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()]))
)
sys.argv = ["dstack", "--help"]
from dstack_plan.cli.__main__ import main
main()
"""


def test_the_console_script_collects_less_often_and_not_during_startup_or_at_exit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    threshold, frozen, enabled = json.loads(done.stdout.strip().splitlines()[-1])
    assert threshold[0] == YOUNG_COLLECTION_THRESHOLD
    assert not enabled  # `--help` does no work, so the start-up pause never ended
    assert frozen > 1000  # what was alive at exit was frozen, so the final collection skips it
