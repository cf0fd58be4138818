"""Group commits (`state/group_commit.py`): concurrent changes of one process stored together,
each caller back only once its own change is stored."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from dstack_plan.state import LocalBackend, ResourceState, State
from dstack_plan.state.group_commit import GroupCommitter
from tests.unit.test_state_backend import NOW


def entry(address: str) -> ResourceState:
    return ResourceState.create(address, provider="local", spec={}, status="ok", now=NOW)


class GatedBackend(LocalBackend):
    """A local backend whose writes wait until the test opens the gate: the commits handed
    in meanwhile pile up, as they do behind a slow disk or an S3 PUT."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.writes = 0

    def write(self, new_state: State, expected: str):  # noqa: ANN201 - as the base's
        self.gate.wait(30)
        self.writes += 1
        return super().write(new_state, expected)


def test_changes_handed_in_while_one_is_written_go_together(tmp_path: Path) -> None:
    backend = GatedBackend(tmp_path / "state.json")

    async def main() -> list[State]:
        committer = GroupCommitter(backend)
        calls = [
            asyncio.ensure_future(
                committer.commit(lambda s, i=i: s.with_resource(entry(f"task.t{i}")))
            )
            for i in range(20)
        ]
        await asyncio.sleep(0)  # every call handed in; the first batch is being written
        backend.gate.set()
        return [snapshot.state for snapshot in await asyncio.gather(*calls)]

    states = asyncio.run(main())
    assert backend.writes < 20  # batched: one write for the first, one for the others
    for i, state in enumerate(states):  # each caller sees its own change stored
        assert state.get(f"task.t{i}") is not None
    stored = backend.read().state
    assert set(stored.resources) == {f"task.t{i}" for i in range(20)}
    assert stored.serial == backend.writes


def test_a_failing_mutation_fails_only_its_caller(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")

    def broken(state: State) -> State:
        raise ValueError("bad change")

    async def main() -> tuple[object, ...]:
        committer = GroupCommitter(backend)
        return tuple(
            await asyncio.gather(
                committer.commit(lambda s: s.with_resource(entry("task.a"))),
                committer.commit(broken),
                committer.commit(lambda s: s.with_resource(entry("task.b"))),
                return_exceptions=True,
            )
        )

    first, failed, last = asyncio.run(main())
    assert isinstance(failed, ValueError)
    assert set(backend.read().state.resources) == {"task.a", "task.b"}
    assert not isinstance(first, BaseException) and not isinstance(last, BaseException)


def test_a_caller_cancelled_while_it_waits_still_has_its_change_stored(tmp_path: Path) -> None:
    backend = GatedBackend(tmp_path / "state.json")

    async def main() -> None:
        committer = GroupCommitter(backend)
        first = asyncio.ensure_future(committer.commit(lambda s: s.with_resource(entry("task.a"))))
        second = asyncio.ensure_future(
            committer.commit(lambda s: s.with_resource(entry("task.b")))
        )
        await asyncio.sleep(0)
        second.cancel()
        backend.gate.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        await committer.close()

    asyncio.run(main())
    assert set(backend.read().state.resources) == {"task.a", "task.b"}
