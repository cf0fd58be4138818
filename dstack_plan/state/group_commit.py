"""Group commits: the state changes that concurrent tasks of one process make, written
together.

An apply runs up to `--parallelism` changes at once, and each commits after every step. One
commit at a time reaches the backend; the mutations handed in while it is being written wait
and then go in one read-modify-write (one journal line or one S3 PUT for all of them). Each
caller still returns only once its own change is stored, so the order of writes that keeps a
killed apply from forgetting anything (`apply/operations.py`) holds as before.

A mutation that raises fails its own caller only: the others of its batch are committed.
A caller cancelled while it waits does not withdraw its change: it is committed with its
batch, as a commit already in a worker thread completes (`close` waits for the last batch).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from dstack_plan.state.backend import StateBackend, StateSnapshot
from dstack_plan.state.commit import Mutation, commit_async
from dstack_plan.state.model import State


@dataclass
class _Waiting:
    mutation: Mutation
    done: asyncio.Future[StateSnapshot] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def __post_init__(self) -> None:
        # a caller cancelled while it waited never reads its outcome: that is no error
        self.done.add_done_callback(lambda f: f.cancelled() or f.exception())


class GroupCommitter:
    """Commits to `backend`, batching the mutations that arrive while a commit is written."""

    def __init__(self, backend: StateBackend) -> None:
        self._backend = backend
        self._waiting: list[_Waiting] = []
        self._writer: asyncio.Task[None] | None = None
        self.commits = 0
        """Read-modify-writes made (for tests and benchmarks: mutations / commits is the
        batching achieved)."""

    async def commit(self, mutation: Mutation) -> StateSnapshot:
        """Store `mutation`'s change (with any others waiting) and return the stored state."""
        waiting = _Waiting(mutation)
        self._waiting.append(waiting)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_batches())
        return await asyncio.shield(waiting.done)

    async def close(self) -> None:
        """Wait until every change handed in is stored (or has failed)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def _write_batches(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            await self._write(batch)

    async def _write(self, batch: list[_Waiting]) -> None:
        """One read-modify-write of every mutation of `batch`; each caller told its outcome."""
        errors: dict[int, Exception] = {}

        def together(state: State) -> State:
            errors.clear()  # a conflict retries the whole batch on the newer state
            for index, waiting in enumerate(batch):
                try:
                    state = waiting.mutation(state)
                except Exception as err:  # noqa: BLE001 - handed back to its caller
                    errors[index] = err
            return state

        self.commits += 1
        try:
            snapshot = await commit_async(self._backend, together)
        except BaseException as err:  # every caller of the batch gets it
            for waiting in batch:
                if not waiting.done.done():
                    waiting.done.set_exception(err)
            if not isinstance(err, Exception):
                raise  # cancelled, or the process is going down
            return
        for index, waiting in enumerate(batch):
            if waiting.done.done():
                continue
            if index in errors:
                waiting.done.set_exception(errors[index])
            else:
                waiting.done.set_result(snapshot)
