"""Secret values never reach state: the guard finds them anywhere in a resource."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import SecretStr

from dstack_plan.errors import StateError
from dstack_plan.state import ResourceState, SecretGuard, State, assert_no_secret_values

NOW = datetime(2025, 1, 2, tzinfo=timezone.utc)


def state_with(**fields: object) -> State:
    values: dict[str, object] = {"spec": {}, "attributes": {}, "status": "ok"} | fields
    rs = ResourceState.create("task.train", provider="local", now=NOW, **values)  # type: ignore[arg-type]
    return State.empty().with_resource(rs)


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"spec": {"env": {"HF_TOKEN": "hf_abcdef123"}}}, ".spec.env.HF_TOKEN"),
        ({"spec": {"commands": ["echo x", "login --token hf_abcdef123 now"]}}, "commands[1]"),
        (
            {"attributes": {"ids": {"hf_abcdef123": 1}}},
            'a key of resources["task.train"].attributes.ids',
        ),
        ({"status": "failed: hf_abcdef123 rejected"}, ".status"),
    ],
)
def test_found_anywhere_and_never_echoed(fields: dict[str, object], where: str) -> None:
    with pytest.raises(StateError) as info:
        assert_no_secret_values(state_with(**fields), ["hf_abcdef123"])
    message = str(info.value)
    assert where in message and 'resources["task.train"]' in message
    assert "hf_abcdef123" not in message


def test_secret_names_are_fine() -> None:
    state = state_with(spec={"env": {"HF_TOKEN": "${{ secrets.HF_TOKEN }}"}})
    assert_no_secret_values(state, ["hf_abcdef123"])


def test_short_secrets_only_match_whole_strings() -> None:
    assert_no_secret_values(state_with(spec={"cmd": "run abc please"}), ["abc"])
    with pytest.raises(StateError):
        assert_no_secret_values(state_with(spec={"pin": "abc"}), ["abc"])


def test_empty_values_ignored() -> None:
    assert_no_secret_values(state_with(spec={"x": ""}), [""])


def test_guard_registers_later_and_unwraps_secret_types() -> None:
    guard = SecretGuard()
    state = state_with(spec={"password": "correct-horse"})
    guard.check(state)
    guard.register(SecretStr("correct-horse"))
    assert len(guard) == 1
    with pytest.raises(StateError, match="contains the value of a secret"):
        guard.check(state)
