"""Errors about a broken state file read as plain sentences, and say what the backup offers."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dstack_plan.cli.app import main
from dstack_plan.errors import StateError
from dstack_plan.state import LocalBackend, ResourceState, State, commit, parse_state

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def parse_error(text: str) -> str:
    with pytest.raises(StateError) as info:
        parse_state(text, "s.json")
    return str(info.value)


def test_a_control_character_says_where_without_a_doubled_at() -> None:
    message = parse_error('{"format_version": 1,\n "lineage": "a\tb"}')
    assert message == (
        "s.json: state file is not valid JSON: Invalid control character at line 2, column 15"
    )


def test_an_unterminated_string_says_where_it_starts() -> None:
    message = parse_error('{"format_version": 1, "lineage": "abc')
    assert message == (
        "s.json: state file is not valid JSON: Unterminated string starting at line 1, column 34"
    )
    assert " at at " not in parse_error('{"lineage": "\x01"}')


def add(address: str) -> object:
    entry = ResourceState.create(address, provider="local", spec={}, status="done", now=NOW)
    return lambda state: state.with_resource(entry)


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    """A state written twice (so it has a backup), then corrupted."""
    backend = LocalBackend(tmp_path / ".dstack" / "state.json")
    commit(backend, add("task.a"))  # type: ignore[arg-type]
    commit(backend, add("task.b"))  # type: ignore[arg-type]
    backend.path.write_text('{"format_version": 1, "lineage": "\x07"}')
    return backend


def read_error(backend: LocalBackend) -> str:
    with pytest.raises(StateError) as info:
        backend.read()
    return str(info.value)


def test_a_good_backup_is_pointed_at(backend: LocalBackend) -> None:
    message = read_error(backend)
    assert message.splitlines() == [
        f"{backend.path}: state file is not valid JSON: Invalid control character at line 1,"
        " column 35",
        f"The previous version is in {backend.backup_path}.",
    ]


def test_a_corrupt_backup_is_not_offered_as_the_way_out(backend: LocalBackend) -> None:
    backend.backup_path.write_text("{truncated")
    message = read_error(backend)
    assert "previous version is in" not in message
    assert message.splitlines()[1] == (
        f"The backup {backend.backup_path} cannot be used either: state file is not valid"
        " JSON: Expecting property name enclosed in double quotes at line 1, column 2"
    )


def test_a_backup_that_is_not_a_state_says_why(backend: LocalBackend) -> None:
    backend.backup_path.write_text('{"lineage": "x"}')
    message = read_error(backend)
    assert message.splitlines()[1] == (
        f"The backup {backend.backup_path} cannot be used either: no format_version;"
        " is this a dstack-plan state file?"
    )


def test_an_unreadable_backup_says_so(backend: LocalBackend) -> None:
    backend.backup_path.unlink()
    backend.backup_path.mkdir()  # root reads any file: a directory cannot be read by anyone
    message = read_error(backend)
    assert "previous version is in" not in message
    assert message.splitlines()[1] == (
        f"The backup {backend.backup_path} cannot be read either: Is a directory."
    )


def test_no_backup_no_hint(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state.json")
    backend.path.write_text("{")
    assert len(read_error(backend).splitlines()) == 1


def test_the_cli_prints_it_cleanly_and_exits_1(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.backup_path.write_text("")
    monkeypatch.setattr(sys, "argv", ["dstack", "state", "list", "--state", str(backend.path)])
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert "Invalid control character at line 1, column 35" in err
    assert "cannot be used either: state file is empty" in err
    assert "Traceback" not in err and "previous version is in" not in err


def test_an_empty_state_still_reads(tmp_path: Path) -> None:
    snapshot = LocalBackend(tmp_path / "none.json").read()
    assert not snapshot.exists and snapshot.state == State(lineage=snapshot.state.lineage)
