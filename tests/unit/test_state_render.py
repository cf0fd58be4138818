"""The fast write path of the local backend: a state rendered entry by entry is byte for byte
`State.to_json()` (whatever the entries hold), renders after a change reuse the unchanged
entries, and the parsed state kept between reads never hides another writer's change."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.state.commit import commit
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.model import ResourceState, State
from dstack_plan.state.render import Renderer

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)


def entry(name: str, attributes: dict) -> ResourceState:
    return ResourceState.create(
        f"task.{name}", provider="local", spec={"name": name}, status="running", now=NOW,
        attributes=attributes,
    )  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(names, st.dictionaries(st.text(max_size=8), json_values, max_size=4)))
def test_rendering_is_byte_identical_to_to_json(entries: dict[str, dict]) -> None:
    state = State(
        lineage="6f1c3c1e-8c1a-4a43-9c9e-5a0f1f0b2b7e",
        serial=7,
        resources={f"task.{n}": entry(n, a) for n, a in entries.items()},
    )
    renderer = Renderer()
    assert renderer.render(state) == state.to_json().encode()
    if entries:  # again after one entry changed: the reused ones still fit exactly
        first = next(iter(entries))
        changed = state.with_resource(entry(first, {"changed": "line\nbreak \u00e9"}))
        assert renderer.render(changed) == changed.to_json().encode()


def test_a_commit_sees_what_another_writer_wrote(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    ours, theirs = LocalBackend(path), LocalBackend(path)
    commit(ours, lambda s: s.with_resource(entry("a", {"n": 1})))
    assert ours.read().state.resources["task.a"].attributes == {"n": 1}  # kept, not reparsed
    commit(theirs, lambda s: s.with_resource(entry("b", {"n": 2})))
    commit(ours, lambda s: s.with_resource(entry("c", {"n": 3})))
    stored = LocalBackend(path).read().state
    assert sorted(stored.resources) == ["task.a", "task.b", "task.c"]
    assert stored.serial == 3
    path.write_text(path.read_text().replace('"n": 1', '"n": 9'))  # edited by hand, in place
    assert ours.read().state.resources["task.a"].attributes == {"n": 9}
