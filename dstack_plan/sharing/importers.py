"""The owner's side: the states of the projects its exports name, read (never written).

The owner's watch reads them to see what importers run on its fleets (their daily GPU-hours,
`watch/importer_quota.py`) and what they wait for (`watch/fair_share.py`), once a tick
whichever rule asks (`Imports.state_at`). A state that cannot be read is
reported and skipped: one importer's broken bucket must not stop the owner's watch.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from dstack_plan.errors import DstackPlanError
from dstack_plan.sharing.imports import Imports
from dstack_plan.state.exports import Importer
from dstack_plan.state.model import State


class ImporterState(NamedTuple):
    """An importer project and its state as read now."""

    importer: Importer
    state: State


def importers_of(state: State) -> dict[str, Importer]:
    """Every project the owner's exports (in `state`) name, by project name."""
    return {i.project: i for e in state.exports.values() for i in e.importers}


async def read_importer(imports: Imports, importer: Importer) -> ImporterState | str:
    """The importer's state, read once per command (or watch tick) through `imports`' cache,
    whichever rule asks; why it could not be read, as a one-line message, otherwise."""
    try:
        state = await asyncio.to_thread(imports.state_at, importer.state)
    except DstackPlanError as e:
        return f"project {importer.project}: cannot read its state at {importer.state}: {e}"
    return ImporterState(importer, state)
