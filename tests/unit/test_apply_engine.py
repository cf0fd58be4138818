"""The apply engine: order, parallelism, state commits, partial failure, interrupts.

The handlers here are an in-memory provider double that records calls, fails on request and
can block on an asyncio.Event; the state backend is a real LocalBackend in tmp_path.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dstack_plan.apply.engine import apply_plan
from dstack_plan.apply.handlers import ApplyContext, Outcome, ResourceHandler
from dstack_plan.apply.interrupt import Interrupt
from dstack_plan.apply.ordering import schedule
from dstack_plan.apply.report import ApplyReport, ResultStatus, describe_error
from dstack_plan.clock import FakeClock
from dstack_plan.errors import ProviderError
from dstack_plan.plan.model import DEPOSED_KEY, Action, Plan, ResourceChange
from dstack_plan.state import (
    LocalBackend,
    ResourceState,
    State,
    commit,
    local,
    parse_state,
    timestamp,
)
from dstack_plan.state.local import JOURNAL_ENV

T = TypeVar("T")
pytestmark = pytest.mark.timeout(60)
NET = 20.0
"""Seconds a test waits for what must happen before it concludes it did not (a safety net:
passing never waits it out)."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class FakeProvider(ResourceHandler):
    """Records every call; fails, blocks or inspects the world on request."""

    def __init__(self, clock: FakeClock | None = None, took: float = 0.0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.finished: list[tuple[str, str]] = []
        self.fail: dict[tuple[str, str], BaseException] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}
        self.on_call: Callable[[str, str], None] | None = None
        self.wait_for_concurrency = 0
        self.concurrency_reached = asyncio.Event()
        self.active = 0
        self.max_active = 0
        self.deleted: list[ResourceState] = []
        self.clock = clock
        self.took = took

    def started_event(self, address: str) -> asyncio.Event:
        return self.started.setdefault(address, asyncio.Event())

    async def _op(self, op: str, address: str) -> None:
        self.calls.append((op, address))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        if self.max_active >= self.wait_for_concurrency:
            self.concurrency_reached.set()
        self.started_event(address).set()
        try:
            if self.on_call is not None:
                self.on_call(op, address)
            if address in self.gates:
                await self.gates[address].wait()
            # every call holds its slot until as many run at once as asked: an engine that
            # ran fewer side by side would leave them waiting here (the net below), and the
            # test's max_active would then say so
            try:
                await asyncio.wait_for(self.concurrency_reached.wait(), NET)
            except asyncio.TimeoutError:
                self.concurrency_reached.set()  # no more waiting: max_active tells the test
            await asyncio.sleep(0)
            if self.clock is not None:
                self.clock.advance(self.took)
            error = self.fail.get((op, address))
            if error is not None:
                raise error
        finally:
            self.active -= 1
        self.finished.append((op, address))

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        await self._op("create", change.address)
        return Outcome(status="running", attributes={"id": f"new-{change.address}"})

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        await self._op("update", change.address)
        return Outcome(status="running", attributes={**current.attributes, "updated": True})

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        await self._op("delete", current.address)
        self.deleted.append(current)


def change(
    address: str,
    action: Action = Action.CREATE,
    *,
    depends_on: tuple[str, ...] = (),
    version: int = 1,
) -> ResourceChange:
    kind, name = address.split(".")
    after = None if action is Action.DELETE else {"name": name, "version": version}
    before = None if action is Action.CREATE else {"name": name, "version": 0}
    return ResourceChange(
        address=address,
        kind=kind,
        name=name,
        provider="local",
        action=action,
        before=before,
        after=after,
        depends_on=depends_on,
    )


def make_plan(*changes: ResourceChange, destroy: bool = False) -> Plan:
    return Plan(lineage="", serial=0, changes=changes, destroy=destroy)


def existing(
    address: str, *, depends_on: tuple[str, ...] = (), **attributes: Any
) -> ResourceState:
    clock = FakeClock(start=1_600_000_000.0)
    return ResourceState.create(
        address,
        provider="local",
        spec={"name": address.split(".")[1], "version": 0},
        status="running",
        now=timestamp(clock),
        attributes={"id": f"old-{address}", **attributes},
        depends_on=depends_on,
    )


def seed(backend: LocalBackend, *entries: ResourceState) -> None:
    def add(state: State) -> State:
        for entry in entries:
            state = state.with_resource(entry)
        return state

    commit(backend, add)


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "state.json")


def handlers_for(provider: FakeProvider) -> dict[str, ResourceHandler]:
    return {"fleet": provider, "task": provider, "service": provider, "volume": provider}


def apply(
    plan: Plan,
    backend: LocalBackend,
    provider: FakeProvider,
    *,
    clock: FakeClock | None = None,
    events: list[tuple[str, str, str]] | None = None,
    **kwargs: Any,
) -> ApplyReport:
    ctx = ApplyContext(clock=clock or FakeClock())
    on_event = (lambda *e: events.append(e)) if events is not None else None
    return run(apply_plan(plan, backend, handlers_for(provider), ctx, on_event=on_event, **kwargs))


def resources(backend: LocalBackend) -> dict[str, ResourceState]:
    return backend.read().state.resources


# --- order ---------------------------------------------------------------------------


def test_creates_start_only_after_their_dependencies_finished(backend: LocalBackend) -> None:
    provider = FakeProvider()
    plan = make_plan(
        change("fleet.a"),
        change("volume.v"),
        change("task.b", depends_on=("fleet.a", "volume.v")),
        change("service.c", depends_on=("task.b",)),
    )
    order: list[tuple[str, list[tuple[str, str]]]] = []
    provider.on_call = lambda op, address: order.append((address, list(provider.finished)))

    report = apply(plan, backend, provider)

    assert report.ok
    seen = dict(order)
    assert {("create", "fleet.a"), ("create", "volume.v")} <= set(seen["task.b"])
    assert ("create", "task.b") in seen["service.c"]
    assert set(resources(backend)) == {"fleet.a", "volume.v", "task.b", "service.c"}


def test_deletes_run_dependents_first_using_state_edges(backend: LocalBackend) -> None:
    seed(
        backend,
        existing("fleet.a"),
        existing("task.b", depends_on=("fleet.a",)),
        existing("service.c", depends_on=("task.b",)),
    )
    provider = FakeProvider()
    plan = make_plan(
        change("fleet.a", Action.DELETE),
        change("task.b", Action.DELETE, depends_on=("fleet.a",)),
        change("service.c", Action.DELETE, depends_on=("task.b",)),
        destroy=True,
    )

    report = apply(plan, backend, provider)

    assert provider.calls == [("delete", "service.c"), ("delete", "task.b"), ("delete", "fleet.a")]
    assert report.summary() == "Destroy complete! Resources: 3 destroyed."
    assert resources(backend) == {}
    assert provider.deleted[0].attributes == {"id": "old-service.c"}


def test_pure_deletes_go_before_other_changes(backend: LocalBackend) -> None:
    seed(backend, existing("fleet.old"), existing("task.keep"))
    provider = FakeProvider()
    plan = make_plan(
        change("fleet.new"),
        change("task.keep", Action.UPDATE),
        change("fleet.old", Action.DELETE),
    )

    apply(plan, backend, provider)

    assert provider.calls[0] == ("delete", "fleet.old")
    assert set(provider.calls[1:]) == {("create", "fleet.new"), ("update", "task.keep")}


def test_a_delete_waits_for_the_replace_of_a_resource_that_used_it(
    backend: LocalBackend,
) -> None:
    # task.b ran on fleet.a; now it moves to fleet.c, and fleet.a goes away
    seed(backend, existing("fleet.a"), existing("task.b", depends_on=("fleet.a",)))
    provider = FakeProvider()
    plan = make_plan(
        change("fleet.a", Action.DELETE),
        change("fleet.c"),
        change("task.b", Action.DELETE_THEN_CREATE, depends_on=("fleet.c",)),
    )

    report = apply(plan, backend, provider)

    assert report.ok
    assert provider.calls == [
        ("create", "fleet.c"),
        ("delete", "task.b"),
        ("create", "task.b"),
        ("delete", "fleet.a"),
    ]
    assert resources(backend)["task.b"].depends_on == ("fleet.c",)


def test_schedule_gates_forward_changes_behind_deletes(backend: LocalBackend) -> None:
    state = State.empty().with_resource(existing("task.b", depends_on=("fleet.a",)))
    plan = make_plan(
        change("fleet.a", Action.DELETE),
        change("fleet.c"),
        change("task.b", Action.DELETE_THEN_CREATE, depends_on=("fleet.c",)),
        change("task.d"),
    )
    order = schedule(plan, state)
    assert order.dependents["fleet.a"] == {"task.b"}
    assert order.dependencies["task.b"] == {"fleet.c"}
    assert order.gated == {"task.d"}  # fleet.c and task.b must run before the delete
    assert order.order[0] == "fleet.a"


def test_noop_changes_do_nothing_but_unblock_dependents(backend: LocalBackend) -> None:
    seed(backend, existing("fleet.a"))
    before = backend.read().state.serial
    provider = FakeProvider()
    plan = make_plan(change("fleet.a", Action.NOOP), change("task.b", depends_on=("fleet.a",)))

    report = apply(plan, backend, provider)

    assert provider.calls == [("create", "task.b")]
    assert report.summary() == "Apply complete! Resources: 1 added, 0 changed, 0 destroyed."
    assert report.result("fleet.a").status is ResultStatus.SUCCEEDED  # type: ignore[union-attr]
    assert resources(backend)["fleet.a"] == existing("fleet.a")
    assert backend.read().state.serial == before + 2  # task.b's intent and its record


# --- parallelism ---------------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 4])
def test_parallelism_bounds_concurrent_handler_calls(
    backend: LocalBackend, parallelism: int
) -> None:
    provider = FakeProvider()
    provider.wait_for_concurrency = parallelism
    plan = make_plan(*(change(f"task.t{i}") for i in range(24)))

    report = apply(plan, backend, provider, parallelism=parallelism)

    assert report.ok
    assert provider.max_active == parallelism
    assert len(resources(backend)) == 24


def test_parallelism_must_be_positive(backend: LocalBackend) -> None:
    with pytest.raises(ValueError, match="parallelism"):
        apply(make_plan(change("task.a")), backend, FakeProvider(), parallelism=0)


# --- state commits -------------------------------------------------------------------


def test_state_is_committed_after_every_resource(backend: LocalBackend) -> None:
    provider = FakeProvider()
    seen: dict[str, tuple[int, dict[str, ResourceState]]] = {}

    def look(op: str, address: str) -> None:
        snapshot = LocalBackend(backend.location).read()
        seen[address] = (snapshot.state.serial, dict(snapshot.state.resources))

    provider.on_call = look
    plan = make_plan(
        change("fleet.a"),
        change("task.b", depends_on=("fleet.a",)),
        change("task.c", depends_on=("task.b",)),
    )

    apply(plan, backend, provider)

    serial, during_c = seen["task.c"]
    assert serial == 5  # intent + record for a and b, then c's intent
    assert not during_c["fleet.a"].tainted and during_c["fleet.a"].status == "running"
    assert during_c["fleet.a"].attributes == {"id": "new-fleet.a"}
    assert not during_c["task.b"].tainted
    assert during_c["task.c"].tainted and during_c["task.c"].status == "creating"
    final = resources(backend)
    assert not final["task.c"].tainted and final["task.c"].status == "running"
    assert final["task.c"].depends_on == ("task.b",)
    assert final["task.c"].spec == {"name": "c", "version": 1}


def test_an_apply_folds_the_journal_its_commits_made(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its many small commits go to the journal; the next reader finds them in the file."""
    monkeypatch.setenv(JOURNAL_ENV, "0")
    monkeypatch.setattr(local, "COMPACT_FROM_BYTES", 0)  # a small state's journal too
    seed(backend, *(existing(f"task.old{i}") for i in range(20)))
    provider = FakeProvider()
    journaled: list[bool] = []
    provider.on_call = lambda op, address: journaled.append(backend.journal_path.exists())
    plan = make_plan(*(change(f"task.t{i}") for i in range(10)))
    apply(plan, backend, provider, parallelism=2)
    assert any(journaled)  # commits during the apply went to the journal
    assert not backend.journal_path.exists()
    on_disk = parse_state(Path(backend.location).read_bytes(), Path(backend.location))
    assert on_disk == backend.read().state and len(on_disk.resources) == 30


def test_intent_is_tainted_while_the_create_runs_and_cleared_after(
    backend: LocalBackend,
) -> None:
    provider = FakeProvider()
    gate = provider.gates["task.a"] = asyncio.Event()

    async def scenario() -> tuple[ResourceState, ApplyReport]:
        ctx = ApplyContext(clock=FakeClock())
        job = asyncio.create_task(
            apply_plan(make_plan(change("task.a")), backend, handlers_for(provider), ctx)
        )
        await provider.started_event("task.a").wait()
        during = resources(backend)["task.a"]
        gate.set()
        return during, await job

    during, report = run(scenario())

    assert during.tainted and during.status == "creating" and during.attributes == {}
    after = resources(backend)["task.a"]
    assert not after.tainted and after.status == "running"
    assert after.created_at == during.created_at
    assert report.ok


def test_a_failed_create_leaves_a_tainted_record(backend: LocalBackend) -> None:
    provider = FakeProvider()
    provider.fail[("create", "task.a")] = ProviderError("local", "no capacity", "task.a")

    report = apply(make_plan(change("task.a")), backend, provider)

    entry = resources(backend)["task.a"]
    assert entry.tainted and entry.status == "creating"
    result = report.result("task.a")
    assert result is not None and result.status is ResultStatus.FAILED
    assert result.message == "local: no capacity"  # the report names task.a already
    assert not result.internal


def test_an_error_about_another_resource_keeps_its_name() -> None:
    other = ProviderError("local", "busy", "fleet.pool")
    assert describe_error(other, "task.a") == ("local: fleet.pool: busy", False, None)
    assert describe_error(ProviderError("local", "busy", "task.a"), "task.a")[0] == "local: busy"


def test_failed_update_and_delete_leave_entries_unchanged(backend: LocalBackend) -> None:
    seed(backend, existing("task.u"), existing("task.d"))
    before = resources(backend)
    provider = FakeProvider()
    provider.fail[("update", "task.u")] = ProviderError("local", "agent down", "task.u")
    provider.fail[("delete", "task.d")] = ProviderError("local", "agent down", "task.d")

    report = apply(
        make_plan(change("task.u", Action.UPDATE), change("task.d", Action.DELETE)),
        backend,
        provider,
    )

    assert resources(backend) == before
    assert [r.address for r in report.failed] == ["task.u", "task.d"]


def test_update_records_the_new_spec_and_attributes(backend: LocalBackend) -> None:
    seed(backend, existing("service.s"))
    report = apply(
        make_plan(change("service.s", Action.UPDATE, version=3)), backend, FakeProvider()
    )

    entry = resources(backend)["service.s"]
    assert entry.spec == {"name": "s", "version": 3}
    assert entry.attributes == {"id": "old-service.s", "updated": True}
    assert report.summary() == "Apply complete! Resources: 0 added, 1 changed, 0 destroyed."


# --- replace -------------------------------------------------------------------------


def test_replace_delete_then_create(backend: LocalBackend) -> None:
    seed(backend, existing("task.r"))
    provider = FakeProvider()
    during: dict[str, ResourceState | None] = {}
    provider.on_call = lambda op, a: during.setdefault(op, resources(backend).get(a))

    report = apply(
        make_plan(change("task.r", Action.DELETE_THEN_CREATE, version=2)), backend, provider
    )

    assert provider.calls == [("delete", "task.r"), ("create", "task.r")]
    assert during["delete"] == existing("task.r")
    intent = during["create"]
    assert intent is not None and intent.tainted and intent.spec["version"] == 2
    final = resources(backend)["task.r"]
    assert final.attributes == {"id": "new-task.r"} and not final.tainted
    assert report.summary() == "Apply complete! Resources: 1 added, 0 changed, 1 destroyed."


def test_replace_create_then_delete_keeps_the_old_object_until_it_is_gone(
    backend: LocalBackend,
) -> None:
    seed(backend, existing("service.s"))
    provider = FakeProvider()
    during: dict[str, ResourceState | None] = {}
    provider.on_call = lambda op, a: during.setdefault(op, resources(backend).get(a))

    report = apply(
        make_plan(change("service.s", Action.CREATE_THEN_DELETE, version=2)), backend, provider
    )

    assert provider.calls == [("create", "service.s"), ("delete", "service.s")]
    intent = during["create"]
    assert intent is not None and intent.tainted
    assert intent.attributes[DEPOSED_KEY][0]["attributes"] == {"id": "old-service.s"}
    # the old object is deleted as recorded, and the new one is already the current entry
    assert provider.deleted == [existing("service.s")]
    assert during["delete"] is not None and during["delete"].attributes["id"] == "new-service.s"
    final = resources(backend)["service.s"]
    assert final.attributes == {"id": "new-service.s"} and not final.tainted
    assert report.summary() == "Apply complete! Resources: 1 added, 0 changed, 1 destroyed."


def test_deposed_object_left_by_a_failed_delete_is_destroyed_next_time(
    backend: LocalBackend,
) -> None:
    seed(backend, existing("service.s"))
    provider = FakeProvider()
    provider.fail[("delete", "service.s")] = ProviderError("local", "busy", "service.s")

    first = apply(
        make_plan(change("service.s", Action.CREATE_THEN_DELETE, version=2)), backend, provider
    )

    assert first.summary() == "Apply failed: 1 added, 0 changed, 0 destroyed, 1 failed, 0 skipped."
    entry = resources(backend)["service.s"]
    assert not entry.tainted and entry.attributes["id"] == "new-service.s"
    assert len(entry.attributes[DEPOSED_KEY]) == 1

    provider.fail.clear()
    second = apply(make_plan(change("service.s", Action.NOOP)), backend, provider)

    assert provider.deleted[-1] == existing("service.s")
    assert resources(backend)["service.s"].attributes == {"id": "new-service.s"}
    assert second.ok


# --- partial failure and the report --------------------------------------------------


def test_failure_skips_only_dependents(backend: LocalBackend) -> None:
    provider = FakeProvider()
    provider.fail[("create", "fleet.a")] = ProviderError("local", "no GPUs", "fleet.a")
    events: list[tuple[str, str, str]] = []
    plan = make_plan(
        change("fleet.a"),
        change("fleet.x"),
        change("task.b", depends_on=("fleet.a",)),
        change("task.y", depends_on=("fleet.x",)),
        change("service.c", depends_on=("task.b",)),
    )

    report = apply(plan, backend, provider, events=events)

    assert not report.ok
    assert [r.address for r in report.succeeded] == ["fleet.x", "task.y"]
    assert [(r.address, r.message) for r in report.skipped] == [
        ("task.b", "dependency fleet.a failed"),
        ("service.c", "dependency fleet.a failed"),
    ]
    assert ("fleet.a", "failed", "local: no GPUs") in events
    assert ("service.c", "skipped", "dependency fleet.a failed") in events
    assert (
        report.summary() == "Apply failed: 2 added, 0 changed, 0 destroyed, 1 failed, 2 skipped."
    )
    assert set(resources(backend)) == {"fleet.a", "fleet.x", "task.y"}


def test_a_failed_delete_keeps_what_it_depends_on(backend: LocalBackend) -> None:
    seed(backend, existing("fleet.a"), existing("task.b", depends_on=("fleet.a",)))
    provider = FakeProvider()
    provider.fail[("delete", "task.b")] = ProviderError("local", "stuck", "task.b")

    report = apply(
        make_plan(
            change("fleet.a", Action.DELETE),
            change("task.b", Action.DELETE, depends_on=("fleet.a",)),
            destroy=True,
        ),
        backend,
        provider,
    )

    assert report.result("fleet.a").message == "dependent task.b failed"  # type: ignore[union-attr]
    assert report.summary() == "Destroy failed: 0 destroyed, 1 failed, 1 skipped."
    assert set(resources(backend)) == {"fleet.a", "task.b"}


def test_report_for_a_mixed_plan(backend: LocalBackend) -> None:
    seed(backend, existing("task.u"), existing("task.r"), existing("task.d"))
    report = apply(
        make_plan(
            change("task.n"),
            change("task.u", Action.UPDATE),
            change("task.r", Action.DELETE_THEN_CREATE),
            change("task.d", Action.DELETE),
        ),
        backend,
        FakeProvider(),
    )
    assert report.ok
    assert report.summary() == "Apply complete! Resources: 2 added, 1 changed, 2 destroyed."
    assert [(r.address, r.steps) for r in report.succeeded] == [
        ("task.n", ("create",)),
        ("task.u", ("update",)),
        ("task.r", ("delete", "create")),
        ("task.d", ("delete",)),
    ]
    dumped = report.model_dump(mode="json")
    assert dumped["results"][0]["status"] == "succeeded"


def test_internal_errors_are_flagged_without_traceback_in_the_message(
    backend: LocalBackend,
) -> None:
    provider = FakeProvider()
    provider.fail[("create", "task.a")] = ValueError("bad value")

    report = apply(make_plan(change("task.a")), backend, provider)

    result = report.result("task.a")
    assert result is not None
    assert result.message == "ValueError: bad value"
    assert result.internal
    assert result.traceback is not None and "Traceback" in result.traceback
    assert "traceback" not in result.model_dump()


def test_missing_handler_fails_that_change(backend: LocalBackend) -> None:
    report = run(
        apply_plan(make_plan(change("gateway.g")), backend, {}, ApplyContext(clock=FakeClock()))
    )
    assert report.failed[0].message == "no handler for resource kind 'gateway'"


def test_events_and_durations_use_the_context_clock(backend: LocalBackend) -> None:
    clock = FakeClock()
    seed(backend, existing("task.r"))
    provider = FakeProvider(clock, took=65)
    events: list[tuple[str, str, str]] = []

    report = apply(
        make_plan(change("task.r", Action.DELETE_THEN_CREATE)),
        backend,
        provider,
        clock=clock,
        events=events,
    )

    assert events == [
        ("task.r", "start", "Destroying..."),
        ("task.r", "done", "Destruction complete after 1m5s"),
        ("task.r", "start", "Creating..."),
        ("task.r", "done", "Creation complete after 1m5s"),
    ]
    assert report.results[0].duration == 130
    entry = resources(backend)["task.r"]
    assert entry.updated_at == timestamp(clock)


# --- interrupts ----------------------------------------------------------------------


def test_first_interrupt_finishes_in_flight_and_starts_nothing_new(
    backend: LocalBackend,
) -> None:
    provider = FakeProvider()
    gates = {a: provider.gates.setdefault(a, asyncio.Event()) for a in ("task.a", "task.b")}
    events: list[tuple[str, str, str]] = []
    interrupt = Interrupt()

    async def scenario() -> ApplyReport:
        ctx = ApplyContext(clock=FakeClock())
        plan = make_plan(*(change(f"task.{n}") for n in "abcd"))
        job = asyncio.create_task(
            apply_plan(
                plan,
                backend,
                handlers_for(provider),
                ctx,
                parallelism=2,
                interrupt=interrupt,
                on_event=lambda *e: events.append(e),
            )
        )
        await provider.started_event("task.a").wait()
        await provider.started_event("task.b").wait()
        interrupt.trigger()
        for gate in gates.values():
            gate.set()
        return await job

    report = run(scenario())

    assert sorted(provider.calls) == [("create", "task.a"), ("create", "task.b")]
    assert report.interrupted and not report.aborted and not report.ok
    assert [r.address for r in report.succeeded] == ["task.a", "task.b"]
    assert [r.address for r in report.not_started] == ["task.c", "task.d"]
    assert set(resources(backend)) == {"task.a", "task.b"}
    assert not any(r.tainted for r in resources(backend).values())
    assert (
        "",
        "interrupt",
        "Interrupt received: finishing 2 operations in progress and starting nothing new; "
        "press Ctrl-C again to abort",
    ) in events
    assert report.summary() == (
        "Apply interrupted: 2 added, 0 changed, 0 destroyed, 0 failed, 0 skipped, 2 not started."
    )


def test_second_interrupt_cancels_in_flight_promptly(backend: LocalBackend) -> None:
    provider = FakeProvider()
    provider.gates["task.a"] = asyncio.Event()  # never set: a create that hangs
    interrupt = Interrupt()

    async def scenario() -> ApplyReport:
        ctx = ApplyContext(clock=FakeClock())
        plan = make_plan(change("task.a"), change("task.b", depends_on=("task.a",)))
        job = asyncio.create_task(
            apply_plan(plan, backend, handlers_for(provider), ctx, interrupt=interrupt)
        )
        await provider.started_event("task.a").wait()
        interrupt.trigger()
        for _ in range(20):  # the engine has every chance to (wrongly) end after one
            await asyncio.sleep(0)
        assert not job.done()  # one interrupt waits for the create in progress
        interrupt.trigger()
        # the create never returns (its gate stays shut): the apply can only end by
        # cancelling it, which is what "promptly" means; NET is only a safety net
        report = await asyncio.wait_for(job, timeout=NET)
        assert provider.active == 0  # the create in progress was cancelled, not left behind
        return report

    report = run(scenario())

    assert not provider.gates["task.a"].is_set()
    assert provider.finished == []  # nothing ran to its end
    assert report.aborted
    assert [r.address for r in report.abandoned] == ["task.a"]
    assert [r.address for r in report.not_started] == ["task.b"]
    entry = resources(backend)["task.a"]
    assert entry.tainted and entry.status == "creating"
    warning = report.abort_warning()
    assert warning is not None and "task.a" in warning and "tainted" in warning
    assert report.summary().endswith("1 not started, 1 aborted.")


def test_cancelling_apply_plan_cancels_its_operations(backend: LocalBackend) -> None:
    provider = FakeProvider()
    provider.gates["task.a"] = asyncio.Event()

    async def scenario() -> None:
        ctx = ApplyContext(clock=FakeClock())
        job = asyncio.create_task(
            apply_plan(make_plan(change("task.a")), backend, handlers_for(provider), ctx)
        )
        await provider.started_event("task.a").wait()
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert provider.active == 0

    run(scenario())
    assert resources(backend)["task.a"].tainted


def test_signal_handlers_trigger_the_interrupt_and_are_restored() -> None:
    interrupt = Interrupt()

    async def scenario() -> Any:
        before = signal.getsignal(signal.SIGTERM)
        with interrupt.signal_handlers():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(int(NET / 0.01)):  # a safety net: the signal comes at once
                if interrupt.count:
                    break
                await asyncio.sleep(0.01)
        return before, signal.getsignal(signal.SIGTERM)

    before, after = run(scenario())
    assert interrupt.count == 1 and interrupt.stopping and not interrupt.aborting
    assert after == before
