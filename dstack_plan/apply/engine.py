"""Executing a plan: walk its changes in dependency order with bounded parallelism.

At most `parallelism` changes run at once; a change starts when its prerequisites (see
`ordering`) have succeeded, and is skipped when one failed, while independent branches go on.
Each change commits state after every step (see `operations`). Interrupts: the first stops
starting new changes and lets running ones finish; the second cancels running ones.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace

from dstack_plan.apply.events import EventCallback, plural, safe_emitter
from dstack_plan.apply.handlers import ApplyContext, ResourceHandler
from dstack_plan.apply.interrupt import Interrupt
from dstack_plan.apply.operations import ChangeRunner, Progress
from dstack_plan.apply.ordering import Schedule, schedule
from dstack_plan.apply.report import ApplyReport, ResourceResult, ResultStatus, describe_error
from dstack_plan.plan.model import Action, Plan, ResourceChange
from dstack_plan.state import Mutation, State, StateBackend
from dstack_plan.state.group_commit import GroupCommitter

logger = logging.getLogger(__name__)

DEFAULT_PARALLELISM = 10
ABORT_GRACE = 5.0
"""Seconds to wait for cancelled operations to unwind after a second interrupt."""


async def apply_plan(
    plan: Plan,
    backend: StateBackend,
    handlers: Mapping[str, ResourceHandler],
    ctx: ApplyContext,
    *,
    parallelism: int = DEFAULT_PARALLELISM,
    interrupt: Interrupt | None = None,
    on_event: EventCallback | None = None,
) -> ApplyReport:
    """Make `plan` real and report what happened to each change.

    The caller holds the operation lock and has checked that the plan is not stale.
    `handlers` maps a kind (`task`, `fleet`, ...) to its handler. Handler errors do not
    raise: they become failed results, and only the dependents of a failed change are
    skipped. `on_event(address, phase, message)` reports progress (see `events`).
    Raises only for a plan whose order is impossible (PlanError) or when cancelled.
    """
    if parallelism < 1:
        raise ValueError("parallelism must be at least 1")
    snapshot = await asyncio.to_thread(backend.read)
    emit = safe_emitter(on_event)
    runner: ChangeRunner | None = None
    # the changes running at once commit together (`state/group_commit.py`)
    committer = GroupCommitter(backend)

    # handlers see the newest state the walk has committed (a run finds the fleet created
    # before it by reading its entry)
    async def commit(mutation: Mutation) -> State:
        return (await committer.commit(mutation)).state

    ctx = replace(ctx, state=lambda: runner.state if runner else snapshot.state, commit=commit)
    runner = ChangeRunner(committer, handlers, ctx, emit, snapshot.state)
    order = schedule(plan, snapshot.state)
    walk = _Walk(plan, order, runner, ctx, parallelism, emit, interrupt or Interrupt())
    try:
        return await walk.run()
    finally:
        await committer.close()  # changes of abandoned steps are stored all the same
        # many small commits went to the journal: fold them in now, once, rather than have
        # every plan and watch tick after this apply replay them
        await asyncio.to_thread(backend.compact)


class _Walk:
    """The scheduler: a ready queue in priority order and at most `parallelism` tasks."""

    def __init__(
        self,
        plan: Plan,
        order: Schedule,
        runner: ChangeRunner,
        ctx: ApplyContext,
        parallelism: int,
        emit: EventCallback,
        interrupt: Interrupt,
    ) -> None:
        self._plan = plan
        self._changes = {c.address: c for c in plan.changes}
        self._order = order
        self._runner = runner
        self._clock = ctx.clock
        self._parallelism = parallelism
        self._emit = emit
        self._rank = {address: i for i, address in enumerate(order.order)}
        self._results: dict[str, ResourceResult] = {}
        self._root_cause: dict[str, str] = {}
        self._running: dict[asyncio.Task[None], tuple[str, Progress]] = {}
        self._abort = asyncio.Event()
        self._interrupt = interrupt

        self._successors: dict[str, list[str]] = defaultdict(list)
        self._unfinished: dict[str, int] = {}
        for address in self._changes:
            prerequisites = order.requires(address)
            for prerequisite in prerequisites:
                self._successors[prerequisite].append(address)
            self._unfinished[address] = len(prerequisites) + (address in order.gated)
        self._deletes_left = len(order.deletes)
        self._ready = [(self._rank[a], a) for a, n in self._unfinished.items() if n == 0]
        heapq.heapify(self._ready)

    async def run(self) -> ApplyReport:
        unsubscribe = self._interrupt.subscribe(self._on_interrupt)
        try:
            await self._loop()
        finally:
            unsubscribe()
            if self._running:  # we were cancelled ourselves: do not leave orphan tasks
                await self._abandon()
        return self._report()

    async def _loop(self) -> None:
        abort = asyncio.ensure_future(self._abort.wait())
        try:
            while True:
                self._start_ready()
                if not self._running:
                    return
                if self._interrupt.aborting:
                    await self._abandon()
                    return
                done, _ = await asyncio.wait(
                    [*self._running, abort], return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task is not abort:
                        self._finish(task)  # type: ignore[arg-type]
        finally:
            abort.cancel()

    def _start_ready(self) -> None:
        while self._ready:
            _, address = self._ready[0]
            change = self._changes[address]
            blocked = self._failed_prerequisite(address)
            if blocked is not None:
                heapq.heappop(self._ready)
                self._settle_skipped(change, *blocked)
                continue
            if not self._runner.has_work(change):
                heapq.heappop(self._ready)
                self._settle(ResourceResult(address=address, action=change.action, status=_OK))
                continue
            if self._interrupt.stopping or len(self._running) >= self._parallelism:
                return
            heapq.heappop(self._ready)
            progress = Progress()
            task = asyncio.create_task(self._runner.run(change, progress), name=address)
            self._running[task] = (address, progress)

    def _failed_prerequisite(self, address: str) -> tuple[str, str] | None:
        """(relation, root cause) of the first prerequisite that did not succeed, if any."""
        for relation, prerequisites in (
            ("dependency", self._order.dependencies[address]),
            ("dependent", self._order.dependents[address]),
        ):
            for prerequisite in sorted(prerequisites, key=self._rank.__getitem__):
                if self._results[prerequisite].status is not _OK:
                    return relation, self._root_cause.get(prerequisite, prerequisite)
        return None

    def _settle_skipped(self, change: ResourceChange, relation: str, root: str) -> None:
        message = f"{relation} {root} failed"
        self._root_cause[change.address] = root
        self._settle(
            ResourceResult(
                address=change.address,
                action=change.action,
                status=ResultStatus.SKIPPED,
                message=message,
            )
        )
        if change.action is not Action.NOOP:
            self._emit(change.address, "skipped", message)

    def _settle(self, result: ResourceResult) -> None:
        """Record a finished change and release whatever waited for it."""
        self._results[result.address] = result
        for successor in self._successors[result.address]:
            self._release(successor)
        if result.address in self._order.deletes:
            self._deletes_left -= 1
            if self._deletes_left == 0:
                for address in self._order.gated:
                    self._release(address)

    def _release(self, address: str) -> None:
        self._unfinished[address] -= 1
        if self._unfinished[address] == 0:
            heapq.heappush(self._ready, (self._rank[address], address))

    def _finish(self, task: asyncio.Task[None]) -> None:
        address, progress = self._running.pop(task)
        change = self._changes[address]
        if task.cancelled():
            self._settle(self._abandoned(change, progress))
            return
        error = task.exception()
        if error is None:
            self._settle(self._result(change, progress, _OK, progress.note))
            return
        message, internal, trace = describe_error(error, address)
        logger.debug("%s failed", address, exc_info=error)
        self._settle(
            self._result(
                change,
                progress,
                ResultStatus.FAILED,
                message,
                internal=internal,
                traceback=trace,
            )
        )
        self._emit(address, "failed", message)

    def _result(
        self,
        change: ResourceChange,
        progress: Progress,
        status: ResultStatus,
        message: str | None,
        **extra: object,
    ) -> ResourceResult:
        began = progress.began
        duration = self._clock.now() - began if began is not None else 0.0
        return ResourceResult(
            address=change.address,
            action=change.action,
            status=status,
            message=message,
            steps=tuple(progress.steps),
            duration=max(0.0, duration),
            **extra,  # type: ignore[arg-type]
        )

    def _abandoned(self, change: ResourceChange, progress: Progress) -> ResourceResult:
        message = "abandoned in progress by a second interrupt"
        creates = change.action is Action.CREATE or change.action.is_replace
        if creates and "create" not in progress.steps:
            message += "; its unfinished create is recorded as tainted for the next plan"
        return self._result(change, progress, ResultStatus.ABORTED, message)

    def _on_interrupt(self, count: int) -> None:
        running = plural(len(self._running), "operation")
        if count == 1:
            self._emit(
                "",
                "interrupt",
                f"Interrupt received: finishing {running} in progress and starting nothing "
                "new; press Ctrl-C again to abort",
            )
        elif count == 2:
            self._emit(
                "",
                "abort",
                f"Two interrupts received: abandoning {running} in progress; they may leave "
                "resources behind (recorded in state as tainted, for the next plan to clean up)",
            )
            self._abort.set()

    async def _abandon(self) -> None:
        """Cancel running changes and wait briefly for them to unwind."""
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        _, stuck = await asyncio.wait(tasks, timeout=ABORT_GRACE)
        for task in tasks:
            if task in stuck:
                address, progress = self._running.pop(task)
                logger.warning(
                    "%s did not stop within %ss of being cancelled", address, ABORT_GRACE
                )
                self._settle(self._abandoned(self._changes[address], progress))
            else:
                self._finish(task)

    def _report(self) -> ApplyReport:
        results = []
        for change in self._plan.changes:
            result = self._results.get(change.address)
            if result is None:
                result = ResourceResult(
                    address=change.address,
                    action=change.action,
                    status=ResultStatus.NOT_STARTED,
                    message="not started (interrupted)",
                )
            results.append(result)
        return ApplyReport(
            destroy=self._plan.destroy,
            results=tuple(results),
            interrupted=self._interrupt.stopping,
            aborted=self._interrupt.aborting,
        )


_OK = ResultStatus.SUCCEEDED
