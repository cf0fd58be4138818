"""Pausing Python's cyclic garbage collector around bulk work, and skipping it at exit."""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC for the body.

    Loading and planning build many small objects that all stay alive; the collector would
    rescan them again and again for nothing (a quarter of the time of a large plan).
    Reference counting still frees everything that is dropped.

    On the way out, what the body built is moved straight to the oldest generation (freeze,
    then unfreeze: two list splices). Otherwise the first young collection after `enable`
    would walk every one of those objects at once: a third of a second for a 10,000-resource
    plan. Cycles among them are still found, by the next full collection.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def spare_exit_collection() -> None:
    """Exempt what is alive at exit from the collection the interpreter runs as it ends.

    A short-lived command ends with tens of thousands of objects (modules, model classes,
    validators) that the process is about to drop wholesale; scanning them once more costs a
    CLI run 50-80 ms. Registered with atexit, so a caller that goes on living (a test calling
    the CLI in-process) keeps a normal collector until its own exit.
    """
    atexit.register(gc.freeze)
