"""Pausing Python's cyclic garbage collector around bulk work: loading a project
(`config/loader.py`) and planning it (`Project.plan`). Kept because it pays: see `gc_paused`
for what removing it cost (alternating with and without in one session on the 2-core VM,
medians)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC for the body.

    Loading and planning build many small objects that all stay alive; the collector would
    rescan them again and again for nothing. Reference counting still frees everything that
    is dropped. Without it, `benchmarks/validate_scale.py` (`load_project`, 10,000 resources)
    took 0.50 -> 0.58 s (+14%) in one file and 0.46 -> 0.56 s (+22%) in 1,000 files;
    `benchmarks/plan_scale.py --sizes 10000` (`Project.plan`, which pauses it around loading
    and planning) 2.31 -> 5.38 s (+133%) for a no-op plan, 2.49 -> 5.92 s (+137%) with 10%
    changes.

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
