"""The bound on waiting for a state backend that does not answer (`state/s3_wait.py`), the
lock's lease from $DSTACK_PLAN_LOCK_LEASE, and the durations both read."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import StateError
from dstack_plan.state import LocalBackend, hold_lock
from dstack_plan.state.env import env_seconds, format_seconds, parse_seconds
from dstack_plan.state.lock import LOCK_LEASE_ENV
from dstack_plan.state.s3 import S3Backend
from dstack_plan.state.s3_location import S3Location
from dstack_plan.state.s3_wait import (
    BACKEND_TIMEOUT_ENV,
    BackendUnresponsive,
    WaitBudget,
    call_within,
)

URL = "s3://team-state/train/state.json?region=eu-west-1"


class NoAnswer(Exception):
    """Stands for botocore's timeouts and refused connections."""


def _unresponsive() -> BackendUnresponsive:
    return BackendUnresponsive("s3://b/k", 3.0)


def _no_answer(err: BaseException) -> bool:
    return isinstance(err, NoAnswer)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("20", 20.0), ("2.5", 2.5), ("20s", 20.0), ("500ms", 0.5), ("5m", 300.0), ("1h", 3600.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "5 minutes", "1e999"])
def test_a_bad_setting_is_an_error_naming_the_variable(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOCK_LEASE_ENV, raw)
    with pytest.raises(StateError, match=LOCK_LEASE_ENV):
        env_seconds(LOCK_LEASE_ENV, 300.0)


def test_durations_read_well() -> None:
    assert [format_seconds(s) for s in (3, 2.5, 59, 192, 300, 3720)] == [
        "3s",
        "2.5s",
        "59s",
        "3m12s",
        "5m",
        "1h2m",
    ]


def test_the_lock_lease_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(tmp_path / "state.json")

    async def lease() -> timedelta:
        async with hold_lock(backend, "apply", clock=FakeClock(), renew=False) as held:
            return held.info.expires - held.info.created

    assert asyncio.run(lease()) == timedelta(minutes=5)
    monkeypatch.setenv(LOCK_LEASE_ENV, "90s")
    assert asyncio.run(lease()) == timedelta(seconds=90)
    monkeypatch.setenv(LOCK_LEASE_ENV, "soon")
    with pytest.raises(StateError, match=LOCK_LEASE_ENV):
        asyncio.run(lease())


def test_the_backend_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert S3Backend(S3Location.from_url(URL)).objects.budget.bound == 20
    monkeypatch.setenv(BACKEND_TIMEOUT_ENV, "7s")
    assert S3Backend(S3Location.from_url(URL)).objects.budget.bound == 7
    monkeypatch.setenv(BACKEND_TIMEOUT_ENV, "never")
    with pytest.raises(StateError, match=BACKEND_TIMEOUT_ENV):
        S3Backend(S3Location.from_url(URL))


def test_the_budget_runs_from_when_the_endpoint_stopped_answering() -> None:
    clock = FakeClock()
    budget = WaitBudget(20, clock)
    assert budget.allowance() == 20
    budget.unanswered(started=clock.now())
    clock.advance(15)
    assert budget.allowance() == 5  # what is left of the bound, not a new one
    clock.advance(5)
    assert budget.spent() and budget.allowance() == 0  # fails at once from now on
    clock.advance(19)
    assert budget.allowance() == 0
    clock.advance(1)  # given up on for another bound: one more try (watch keeps running)
    assert budget.allowance() == 20
    budget.unanswered(started=clock.now())
    budget.answered()  # any answer ends the outage
    assert budget.allowance() == 20 and not budget.spent()


def test_a_request_that_hangs_is_given_up_on_and_the_next_fails_at_once() -> None:
    budget = WaitBudget(0.2)
    release = threading.Event()
    calls: list[str] = []

    def hangs() -> str:
        calls.append("hangs")
        release.wait(60)
        return "late"

    try:
        with pytest.raises(BackendUnresponsive, match="did not answer within 3s"):
            call_within(budget, hangs, _no_answer, _unresponsive)
        with pytest.raises(BackendUnresponsive):
            call_within(budget, lambda: calls.append("next") or "x", _no_answer, _unresponsive)
    finally:
        release.set()
    assert calls == ["hangs"]  # the next request was not even sent


def test_errors_that_are_answers_pass_through_and_end_an_outage() -> None:
    clock = FakeClock()
    budget = WaitBudget(20, clock)

    def refused() -> str:
        clock.advance(2)
        raise NoAnswer("connection refused")

    with pytest.raises(NoAnswer):  # a quick failure within the bound: its own message
        call_within(budget, refused, _no_answer, _unresponsive)
    assert budget.allowance() == 18

    def denied() -> str:
        raise PermissionError("AccessDenied")

    with pytest.raises(PermissionError):
        call_within(budget, denied, _no_answer, _unresponsive)
    assert budget.allowance() == 20  # an error status is an answer
    assert call_within(budget, lambda: "ok", _no_answer, _unresponsive) == "ok"


def test_failures_without_an_answer_add_up_to_the_bound() -> None:
    clock = FakeClock()
    budget = WaitBudget(20, clock)

    def times_out() -> str:
        clock.advance(12)
        raise NoAnswer("read timeout")

    with pytest.raises(NoAnswer):
        call_within(budget, times_out, _no_answer, _unresponsive)
    with pytest.raises(BackendUnresponsive):  # 24 s without an answer: past the bound
        call_within(budget, times_out, _no_answer, _unresponsive)
    with pytest.raises(BackendUnresponsive):
        call_within(budget, lambda: "never sent", _no_answer, _unresponsive)


def test_the_message_says_what_was_committed() -> None:
    err = BackendUnresponsive("s3://b/state.json", 20.0)
    err = err.with_outcome("nothing was committed").with_note("The lock may have been taken")
    assert str(err).startswith(
        "the state backend s3://b/state.json did not answer within 20s; nothing was"
        " committed. The lock may have been taken"
    )
    assert BACKEND_TIMEOUT_ENV in str(err)
