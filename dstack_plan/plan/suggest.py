"""`did you mean ...?` for an address given on the command line that names nothing."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(address: str, known: Iterable[str]) -> str:
    """`; did you mean task.count?` when `address` is a name without its kind, or close to
    known addresses; else "". Known addresses are `kind.name`."""
    candidates = sorted(set(known))
    if "." not in address:
        matches = [a for a in candidates if a.partition(".")[2] == address]
    else:
        matches = []
    if not matches:
        matches = difflib.get_close_matches(address, candidates, n=3, cutoff=0.75)
    if not matches:
        return ""
    return f"; did you mean {' or '.join(matches)}?"
