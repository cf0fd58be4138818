"""Pausing Python's cyclic garbage collector around bulk work."""

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


_startup = {"paused": False}


def pause_for_startup() -> None:
    """No cyclic GC while a command starts: until `resume_after_startup`.

    Importing typer, pydantic and our models creates some 50,000 container objects that all
    live until exit. At any threshold the collector ends up scanning each of them at least
    once, for nothing: one young collection of that size cost `dstack plan` ~19 ms (4% of
    its run). Reference counting still frees what is dropped.
    """
    if gc.isenabled():
        gc.disable()
        _startup["paused"] = True


def resume_after_startup() -> None:
    """Turn the collector back on, leaving what start-up built out of every future scan.

    Called where a command's real work begins (`cli.common.run_with`), so long-running work
    (`apply --attach`, `logs -f`) collects its cycles as usual. The start-up objects are
    frozen into the permanent generation first: otherwise the first young collection would
    walk all of them at once. A no-op unless `pause_for_startup` paused the collector.
    """
    if _startup["paused"]:
        _startup["paused"] = False
        gc.freeze()
        gc.enable()


YOUNG_COLLECTION_THRESHOLD = 50_000
"""Net new container objects between two young-generation collections (Python's default: 700)."""


def collect_less_often() -> None:
    """Run the young-generation collection every 50,000 new objects instead of every 700.

    A command's work (validators built on first use, a large plan, an apply's records) also
    creates many objects that live until exit; at the default threshold the collector keeps
    rescanning them. Cycles are still found, in larger batches, so long-running commands
    (`apply --attach`, `logs -f`) keep a bounded amount of garbage; mypy runs with a
    threshold of 200,000 for the same reason.
    """
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)
