"""Read-modify-write commits with compare-and-swap, retried when someone wrote in between."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from dstack_plan.state.backend import StateBackend, StateConflictError, StateSnapshot
from dstack_plan.state.model import State
from dstack_plan.state.s3_wait import BackendUnresponsive

Mutation = Callable[[State], State]
"""A re-applicable change: given the latest state, return the wanted one. Must be pure."""


def commit(
    backend: StateBackend,
    mutate: Mutation,
    *,
    attempts: int | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> StateSnapshot:
    """Read the state, apply `mutate`, write it back with CAS; on conflict start over.

    Runs inside `backend.exclusive()`, so with the local backend commits never conflict;
    with others a conflict is retried after a random pause (`pause`, growing with each
    attempt up to the backend's `commit_max_pause`) so racing writers drift apart instead of
    starving one another. Returns the stored snapshot: unchanged, and without a write, when
    `mutate` changes nothing. Raises StateConflictError after `attempts` conflicts (default:
    the backend's `commit_attempts`), and BackendUnresponsive (saying whether this commit is
    stored, not, or in doubt) when the backend stopped answering.
    """
    if attempts is None:
        attempts = backend.commit_attempts
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    for attempt in range(1, attempts + 1):
        with backend.exclusive():
            try:
                snapshot = backend.read()
            except BackendUnresponsive as err:
                # the backend says what it stored; this commit never got to be sent
                outcome = f"; {err.outcome}" if err.outcome else ""
                raise err.with_outcome(f"this commit was not stored{outcome}") from None
            proposed = mutate(snapshot.state)
            if (
                proposed.same_content(snapshot.state)
                and proposed.lineage == snapshot.state.lineage
            ):
                return snapshot
            try:
                return backend.write(proposed, snapshot.version)
            except StateConflictError as err:
                if attempt == attempts:
                    raise StateConflictError(
                        f"{err} (gave up after {attempts} attempts)",
                        current=err.current,
                        expected=err.expected,
                    ) from None
        pause(random.uniform(0, min(backend.commit_max_pause, 0.002 * 2**attempt)))
    raise AssertionError("unreachable")


async def commit_async(
    backend: StateBackend, mutate: Mutation, *, attempts: int | None = None
) -> StateSnapshot:
    """`commit` in a worker thread, so a network backend does not stall the event loop."""
    return await asyncio.to_thread(commit, backend, mutate, attempts=attempts)
