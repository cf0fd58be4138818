"""A commit's journal record is built from the steps that made the new state when it was made
from the old one by `with_resource` and `without`: it must be the very change a comparison
of every entry finds, whatever the steps (adds, replacements, removals, undone steps, copies
that only bump the serial), and a state copied onto other resources must not be taken for
one made step by step."""

from __future__ import annotations

import gc
import random
from datetime import datetime, timezone

from dstack_plan.state import State
from dstack_plan.state.journal import change_of
from dstack_plan.state.model import ResourceState

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def entry(address: str, **spec: object) -> ResourceState:
    return ResourceState.create(address, provider="local", spec=spec, status="ok", now=NOW)


def compared(old: State, new: State) -> tuple[dict[str, ResourceState], tuple[str, ...]]:
    """The change every entry's comparison finds: (put, removed)."""
    put = {a: e for a, e in new.resources.items() if old.resources.get(a) != e}
    return put, tuple(sorted(old.resources.keys() - new.resources.keys()))


def base(count: int) -> State:
    resources = {f"task.t{i}": entry(f"task.t{i}", i=i) for i in range(count)}
    return State.empty().model_copy(update={"resources": resources, "serial": 3})


def test_random_steps_give_the_change_a_full_comparison_finds() -> None:
    rng = random.Random(20261206)
    for _ in range(200):
        old = base(30)
        proposed = old
        for _ in range(rng.randint(1, 12)):
            address = f"task.t{rng.randrange(40)}"  # some new, most existing
            roll = rng.random()
            if roll < 0.45:
                proposed = proposed.with_resource(entry(address, i=rng.randrange(3)))
            elif roll < 0.8:
                proposed = proposed.without(address)
            elif address in old.resources:
                proposed = proposed.with_resource(old.resources[address])  # a step undone
        # what a backend writes: the mutation's result with the next serial
        written = proposed.model_copy(update={"serial": old.serial + 1})
        for new in (proposed, written):
            assert new.touched_since(old) is not None  # the steps were used, not a full scan
            record = change_of(old, new)
            assert (record.put, record.removed) == compared(old, new)


def test_a_copy_that_outlived_the_state_it_copied_is_compared_in_full() -> None:
    old = base(10)
    written = old.with_resource(entry("task.t1", i=50)).model_copy(update={"serial": 9})
    gc.collect()
    assert written.touched_since(old) is None
    record = change_of(old, written)
    assert (record.put, record.removed) == compared(old, written)
    assert set(record.put) == {"task.t1"}


def test_the_ancestor_may_be_a_copy_that_only_bumped_the_serial() -> None:
    written = base(10).model_copy(update={"serial": 4})  # what a backend hands back
    new = written.with_resource(entry("task.t3", i=99)).without("task.t4")
    assert new.touched_since(written) == {"task.t3", "task.t4"}
    record = change_of(written, new)
    assert set(record.put) == {"task.t3"} and record.removed == ("task.t4",)


def test_a_state_copied_onto_other_resources_is_compared_in_full() -> None:
    old = base(10)
    stepped = old.with_resource(entry("task.t1", i=50))
    # a copy with a resources dict of its own: the steps no longer describe it
    rebuilt = stepped.model_copy(
        update={"resources": {**stepped.resources, "task.t2": entry("task.t2", i=7)}}
    )
    assert rebuilt.touched_since(old) is None
    record = change_of(old, rebuilt)
    assert (record.put, record.removed) == compared(old, rebuilt)
    assert set(record.put) == {"task.t1", "task.t2"}


def test_an_unrelated_or_collected_ancestor_is_not_matched() -> None:
    old = base(10)
    other = base(10)  # equal content, but not what `new` was made from
    new = old.with_resource(entry("task.t1", i=50))
    assert new.touched_since(other) is None
    middle = new.with_resource(entry("task.t2", i=51))
    latest = middle.without("task.t3")
    del new, middle
    gc.collect()
    assert latest.touched_since(old) == {"task.t1", "task.t2", "task.t3"}
    assert (change_of(old, latest).put, change_of(old, latest).removed) == compared(old, latest)


def test_derived_states_compare_and_copy_by_their_fields_alone() -> None:
    old = base(5)
    new = old.with_resource(entry("task.t1", i=9))
    parsed = State.model_validate_json(new.model_dump_json())
    assert parsed == new and new == parsed
