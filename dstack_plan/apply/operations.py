"""One planned change made real: handler calls, each followed by its state commit.

Order of writes, so that a process killed at any moment forgets nothing that exists:
- create: commit a tainted intent entry, call `create`, commit the real entry;
- update: call `update`, commit the new spec and attributes;
- delete: call `delete`, then remove the entry;
- delete-then-create: `delete`, then swap the old entry for the intent in one commit, then as
  create;
- create-then-delete: commit the intent holding the old object as deposed, create, commit,
  then destroy each deposed object and commit its removal.
A handler error leaves the entry as the last commit put it: tainted after a failed create.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import TypeVar

from dstack_plan.apply import records
from dstack_plan.apply.events import EventCallback, Step, complete_message, starting_message
from dstack_plan.apply.handlers import ApplyContext, Outcome, ResourceHandler
from dstack_plan.errors import PlanError
from dstack_plan.plan.model import Action, ResourceChange
from dstack_plan.state import Mutation, ResourceState, State, timestamp
from dstack_plan.state.group_commit import GroupCommitter

T = TypeVar("T")


@dataclass
class Progress:
    """What one change has done so far; read by the engine even when the change is abandoned."""

    steps: list[Step] = field(default_factory=list)
    began: float | None = None
    ended: float | None = None
    note: str | None = None


class ChangeRunner:
    """Runs changes against `handlers` (by kind), committing through `committer` after
    each step."""

    def __init__(
        self,
        committer: GroupCommitter,
        handlers: Mapping[str, ResourceHandler],
        ctx: ApplyContext,
        emit: EventCallback,
        state: State,
    ) -> None:
        self._committer = committer
        self._handlers = handlers
        self._ctx = ctx
        self._emit = emit
        self._state = state

    @property
    def state(self) -> State:
        """The newest state this runner has read or written."""
        return self._state

    def has_work(self, change: ResourceChange) -> bool:
        """False for a no-op with no deposed objects left to destroy: it completes at once."""
        if change.action is not Action.NOOP or change.origin_only:
            return True
        return bool(records.deposed_of(self._state.get(change.address)))

    async def run(self, change: ResourceChange, progress: Progress) -> None:
        """Make `change` real; raises what the handler or the state backend raised."""
        handler = self._handler(change.kind)
        action = change.action
        if action is Action.CREATE_THEN_DELETE:
            await self._create_then_delete(change, handler, progress)
            return
        # Leftovers of an earlier create-before-destroy go first, so a delete or
        # replace never loses track of them.
        await self._destroy_deposed(change.address, handler, progress)
        if action is Action.CREATE:
            await self._create(change, handler, progress)
        elif action is Action.UPDATE:
            await self._update(change, handler, progress)
        elif action is Action.DELETE:
            await self._delete(change.address, handler, progress)
        elif action is Action.DELETE_THEN_CREATE:
            await self._delete_then_create(change, handler, progress)
        elif change.origin_only:  # a submitted resource the directory now declares
            await self._commit(records.put_origin(change, self._now()))

    def _handler(self, kind: str) -> ResourceHandler:
        handler = self._handlers.get(kind)
        if handler is None:
            raise PlanError(f"no handler for resource kind {kind!r}")
        return handler

    def _now(self) -> datetime:
        return timestamp(self._ctx.clock)

    def _drop_deposed(self, address: str, old: ResourceState, _deleted: None) -> Mutation:
        return records.drop_deposed(address, old, self._now())

    async def _commit(self, mutation: Mutation) -> None:
        snapshot = await self._committer.commit(mutation)
        # Commits of parallel changes may return out of order; the highest serial holds all.
        if snapshot.state.serial >= self._state.serial:
            self._state = snapshot.state

    async def _step(
        self,
        address: str,
        step: Step,
        call: Callable[[], Awaitable[T]],
        record: Callable[[T], Mutation],
        progress: Progress,
        *,
        deposed: bool = False,
    ) -> T:
        """One handler call and the commit recording its result, bracketed by events."""
        self._emit(address, "start", starting_message(step, deposed=deposed))
        began = self._ctx.clock.now()
        if progress.began is None:
            progress.began = began
        result = await call()
        # No await between the handler's return and handing the commit over: even a task
        # cancelled right now has its change stored by the committer, which completes.
        await self._commit(record(result))
        progress.steps.append(step)
        progress.ended = self._ctx.clock.now()
        self._emit(
            address, "done", complete_message(step, progress.ended - began, deposed=deposed)
        )
        return result

    async def _create(
        self,
        change: ResourceChange,
        handler: ResourceHandler,
        progress: Progress,
        deposed: list[ResourceState] | None = None,
        *,
        intent_committed: bool = False,
    ) -> Outcome:
        if not intent_committed:
            await self._commit(records.put(records.intent(change, self._now(), deposed)))
        return await self._step(
            change.address,
            "create",
            lambda: handler.create(change, self._ctx),
            lambda outcome: records.put_created(change, outcome, self._now(), deposed or []),
            progress,
        )

    async def _update(
        self, change: ResourceChange, handler: ResourceHandler, progress: Progress
    ) -> None:
        current = self._state.get(change.address)
        if current is None:
            raise PlanError(
                f"{change.address} is no longer in state, so it cannot be updated; run plan again"
            )
        await self._step(
            change.address,
            "update",
            lambda: handler.update(change, records.for_handler(current), self._ctx),
            lambda outcome: records.put_updated(change, outcome, self._now()),
            progress,
        )

    async def _delete(self, address: str, handler: ResourceHandler, progress: Progress) -> None:
        current = self._state.get(address)
        if current is None:
            progress.note = "already absent from state"
            return
        await self._step(
            address,
            "delete",
            lambda: handler.delete(records.for_handler(current), self._ctx),
            lambda _: records.remove(address),
            progress,
        )

    async def _delete_then_create(
        self, change: ResourceChange, handler: ResourceHandler, progress: Progress
    ) -> None:
        current = self._state.get(change.address)
        if current is not None:
            ctx = replace(self._ctx, successor=change.after)
            await self._step(
                change.address,
                "delete",
                lambda: handler.delete(records.for_handler(current), ctx),
                # the old entry gives way to the intent in one write: no moment without either
                lambda _: records.put(records.intent(change, self._now())),
                progress,
            )
        await self._create(change, handler, progress, intent_committed=current is not None)

    async def _create_then_delete(
        self, change: ResourceChange, handler: ResourceHandler, progress: Progress
    ) -> None:
        current = self._state.get(change.address)
        deposed = records.deposed_of(current)
        if current is not None:
            deposed.append(records.for_handler(current))
        await self._create(change, handler, progress, deposed)
        await self._destroy_deposed(change.address, handler, progress)

    async def _destroy_deposed(
        self, address: str, handler: ResourceHandler, progress: Progress
    ) -> None:
        live = self._state.get(address)
        ctx = replace(self._ctx, replacement=records.for_handler(live) if live else None)
        for old in records.deposed_of(live):
            await self._step(
                address,
                "delete",
                partial(handler.delete, old, ctx),
                partial(self._drop_deposed, address, old),
                progress,
                deposed=True,
            )
