"""Watch's retry decisions (watch/retry.py): events, clocks, whole-run vs replica, backoff."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec, ServiceSpec, TaskSpec
from dstack_plan.runs.records import JobRecord
from dstack_plan.watch.retry import (
    INSTANCE_UNREACHABLE,
    NO_CAPACITY,
    JobOutcome,
    RetryState,
    backoff,
    decide_retry,
)

T = 1_800_000_000.0  # an arbitrary "now-ish" epoch second


def task(**fields: Any) -> TaskSpec:
    return TaskSpec.model_validate({"type": "task", "name": "train", "commands": ["x"], **fields})


def service(**fields: Any) -> ServiceSpec:
    data = {"type": "service", "name": "web", "port": 8000, "commands": ["serve"]}
    return ServiceSpec.model_validate({**data, **fields})


def job(
    status: str,
    reason: str | None = None,
    *,
    replica: int = 0,
    node: int = 0,
    ended_at: float | None = None,
    exit_code: int | None = None,
    job_id: str | None = "auto",
) -> JobOutcome:
    return JobOutcome(
        job_id=f"j-{replica}-{node}" if job_id == "auto" else job_id,
        replica=replica,
        node=node,
        status=status,
        reason=reason,
        exit_code=exit_code,
        ended_at=ended_at,
    )


def exited(code: int = 1, **kw: Any) -> JobOutcome:
    return job("failed", "container_exited_with_error", exit_code=code, **kw)


def decide(
    spec: RunSpec,
    jobs: list[JobOutcome],
    now: float,
    state: RetryState | None = None,
    submitted_at: float = T,
    **kw: Any,
) -> Any:
    return decide_retry(spec, jobs, state or RetryState(), now, submitted_at=submitted_at, **kw)


@pytest.mark.parametrize(
    ("attempt", "seconds"),
    [(0, 15), (1, 15), (2, 30), (3, 60), (4, 120), (5, 300), (6, 600), (7, 600), (50, 600)],
)
def test_backoff_sequence(attempt: int, seconds: float) -> None:
    assert backoff(attempt) == seconds


@pytest.mark.parametrize(
    ("outcome", "failed", "event"),
    [
        (job("running"), False, None),
        (job("unknown"), False, None),  # host silent, not yet declared unreachable
        (job("done", "done_by_runner", exit_code=0), False, None),
        (exited(3), True, "error"),
        (job("failed", "creating_container_error"), True, "error"),
        (job("failed", "executor_error"), True, "error"),
        (job("failed"), True, "error"),  # no reason given: still an error
        (job("failed", INSTANCE_UNREACHABLE), True, "interruption"),
        (job("failed", "interrupted_by_no_capacity"), True, "interruption"),
        (job("failed", NO_CAPACITY, job_id=None), True, "no-capacity"),
        (job("terminated", "terminated_by_user", exit_code=143), False, None),
        (job("aborted", "aborted_by_user", exit_code=137), False, None),
        (job("terminated", "max_duration_exceeded", exit_code=143), False, None),
    ],
)
def test_what_counts_as_a_failure(outcome: JobOutcome, failed: bool, event: str | None) -> None:
    assert outcome.failed is failed
    if failed:
        assert outcome.event == event


def test_from_agent_records() -> None:
    info = JobInfo.model_validate(
        {
            "id": "abc",
            "run_name": "train",
            "runtime": "process",
            "status": "failed",
            "termination_reason": "container_exited_with_error",
            "exit_code": 2,
            "submitted_at": T,
            "started_at": T + 1,
            "finished_at": T + 5,
        }
    )
    record = JobRecord(id="abc", replica=1, node=2)
    outcome = JobOutcome.of(record, info)
    assert (outcome.slot, outcome.event, outcome.ended_at) == ((1, 2), "error", T + 5)
    lost = JobOutcome.unreachable(record, T + 9)
    assert (lost.event, lost.ended_at, lost.job_id) == ("interruption", T + 9, "abc")
    unplaced = JobOutcome.unplaced(0, 1, T)
    assert (unplaced.event, unplaced.job_id, unplaced.slot) == ("no-capacity", None, (0, 1))


@pytest.mark.parametrize(
    ("retry", "outcome", "reason"),
    [
        (None, exited(ended_at=T), "job_failed"),
        ({"on_events": ["no-capacity"]}, exited(ended_at=T), "job_failed"),
        ({"on_events": ["error"]}, job("failed", INSTANCE_UNREACHABLE, ended_at=T), "job_failed"),
        (
            {"on_events": ["error"]},
            job("failed", NO_CAPACITY, ended_at=T, job_id=None),
            "job_failed",
        ),
    ],
)
def test_failures_retry_does_not_cover_fail_the_run(
    retry: Any, outcome: JobOutcome, reason: str
) -> None:
    decision = decide(task(retry=retry), [outcome], now=T + 1)
    assert (decision.action, decision.reason) == ("fail", reason)


@pytest.mark.parametrize(
    "jobs",
    [
        [job("terminated", "terminated_by_user", ended_at=T)],
        [job("aborted", "aborted_by_user", ended_at=T)],
        # the user stopped it, and a node then died of the stop: still the user's stop
        [
            job("terminated", "terminated_by_user", node=0, ended_at=T),
            exited(node=1, ended_at=T + 2),
        ],
    ],
)
def test_a_run_stopped_by_the_user_is_never_retried(jobs: list[JobOutcome]) -> None:
    decision = decide(task(retry=True, nodes=2), jobs, now=T + 3600)
    assert decision.action == "none"
    assert "user" in decision.message


def test_multi_node_task_restarts_as_a_whole_after_backoff() -> None:
    spec = task(nodes=3, retry={"on_events": ["error"], "duration": "1h"})
    jobs = [
        job("running", node=0),
        exited(node=1, ended_at=T),
        job("done", "done_by_runner", node=2, exit_code=0, ended_at=T - 5),
    ]
    waiting = decide(spec, jobs, now=T + 1)
    assert waiting.action == "wait" and waiting.whole_run
    assert waiting.at == T + 15
    assert waiting.slots == ((0, 0), (0, 1), (0, 2))  # every node, the done one too
    assert waiting.stop == ("j-0-0",)  # still running: stopped before the resubmission
    assert waiting.state.next_attempt_at == T + 15
    assert waiting.state.last_failure_at == T and waiting.state.last_event == "error"

    # the survivor was stopped by watch (through the agent's user stop) after the failure
    jobs[0] = job("terminated", "terminated_by_user", node=0, ended_at=T + 3)
    again = decide(spec, jobs, now=T + 14.9, state=waiting.state)
    assert again.action == "wait" and again.stop == ()
    due = decide(spec, jobs, now=T + 15, state=again.state)
    assert due.action == "resubmit" and due.whole_run
    assert due.slots == ((0, 0), (0, 1), (0, 2))
    assert due.state.attempts == 1 and due.state.next_attempt_at is None


def test_service_replica_is_resubmitted_alone_at_once() -> None:
    spec = service(replicas=3, retry=True)
    jobs = [
        job("running", replica=0),
        exited(replica=1, ended_at=T),
        job("running", replica=2),
    ]
    decision = decide(spec, jobs, now=T + 1)
    assert decision.action == "resubmit"
    assert not decision.whole_run
    assert decision.slots == ((1, 0),)
    assert decision.state.attempts == 0  # the run never went pending


def test_service_with_no_replica_left_goes_pending_as_a_whole() -> None:
    spec = service(replicas=2, retry=True)
    jobs = [
        exited(replica=0, ended_at=T),
        job("failed", INSTANCE_UNREACHABLE, replica=1, ended_at=T),
    ]
    decision = decide(spec, jobs, now=T + 1)
    assert (decision.action, decision.whole_run, decision.at) == ("wait", True, T + 15)
    assert decision.slots == ((0, 0), (1, 0))


def test_dev_environment_restarts_as_a_whole() -> None:
    spec = DevEnvironmentSpec.model_validate(
        {"type": "dev-environment", "name": "dev", "retry": True}
    )
    decision = decide(spec, [exited(ended_at=T)], now=T + 20)
    assert (decision.action, decision.whole_run, decision.slots) == ("resubmit", True, ((0, 0),))


# no-capacity of a run never placed: its age counts (since submission); exceeded is strict
@pytest.mark.parametrize(
    ("placed_at", "action", "reason"),
    [
        (T + 59, "wait", None),
        (T + 60, "wait", None),
        (T + 60.5, "fail", "retry_limit_exceeded"),
    ],
)
def test_no_capacity_counts_from_submission(
    placed_at: float, action: str, reason: str | None
) -> None:
    spec = task(retry={"on_events": ["no-capacity"], "duration": "1m"})
    unplaced = JobOutcome.unplaced(0, 0, placed_at)
    decision = decide(spec, [unplaced], now=placed_at, submitted_at=T)
    assert (decision.action, decision.reason) == (action, reason)


# after a placed job failed, a no-capacity counts from that failure, not from submission
@pytest.mark.parametrize(("placed_at", "action"), [(T + 3600, "wait"), (T + 3600.5, "fail")])
def test_no_capacity_after_a_failure_counts_from_the_last_failure(
    placed_at: float, action: str
) -> None:
    spec = task(retry={"duration": "1h"})
    state = RetryState(attempts=1, last_failure_at=T)
    unplaced = JobOutcome.unplaced(0, 0, placed_at)
    decision = decide(spec, [unplaced], now=placed_at, state=state, submitted_at=T - 86400)
    assert decision.action == action
    if action == "fail":
        assert "since the last failure" in decision.message


def test_an_error_after_a_long_run_is_still_retried() -> None:
    # the duration bounds getting back up, not the job's whole life
    spec = task(retry={"on_events": ["error"], "duration": "1m"})
    decision = decide(spec, [exited(ended_at=T + 86400)], now=T + 86401, submitted_at=T)
    assert decision.action == "wait"


def test_a_watch_outage_does_not_use_up_the_retry_window() -> None:
    spec = task(retry={"on_events": ["error"], "duration": "1m"})
    decision = decide(spec, [exited(ended_at=T)], now=T + 7200)
    assert decision.action == "resubmit"  # overdue: at once


def test_pending_run_climbs_the_backoff_ladder_then_resets_once_placed() -> None:
    spec = task(retry={"on_events": ["no-capacity"], "duration": "1d"})
    state = RetryState()
    now = T
    waits = []
    for _ in range(7):
        unplaced = [JobOutcome.unplaced(0, 0, now)]
        wait = decide(spec, unplaced, now=now, state=state)
        assert wait.action == "wait"
        waits.append(wait.at - now)
        now = wait.at
        go = decide(spec, unplaced, now=now, state=wait.state)
        assert go.action == "resubmit"
        state = go.state
    assert waits == [15, 30, 60, 120, 300, 600, 600]
    assert state.attempts == 7 and state.first_failure_at == T
    placed = decide(spec, [job("submitted")], now=now, state=state)
    assert placed.action == "none"
    assert placed.state.attempts == 0 and placed.state.first_failure_at is None


def test_freed_capacity_wakes_a_run_waiting_for_it() -> None:
    spec = task(retry=True)
    state = RetryState(attempts=5)
    unplaced = [JobOutcome.unplaced(0, 0, T)]
    assert decide(spec, unplaced, now=T + 20, state=state).at == T + 600
    early = decide(spec, unplaced, now=T + 20, state=state, capacity_freed_at=T + 10)
    assert early.action == "resubmit"
    stale = decide(spec, unplaced, now=T + 20, state=state, capacity_freed_at=T - 10)
    assert stale.action == "wait"  # freed before the attempt that failed: no news


def test_nothing_failed_means_nothing_to_do() -> None:
    decision = decide(task(retry=True), [job("running"), job("unknown", node=1)], now=T)
    assert decision.action == "none"


def test_state_round_trips_through_state_attributes() -> None:
    state = RetryState(attempts=2, first_failure_at=T, last_event="error", last_reason="x")
    assert RetryState.from_json(state.to_json()) == state
    assert RetryState.from_json(None) == RetryState()
    assert RetryState.from_json({"attempts": "many"}) == RetryState()


def test_the_caller_may_say_whether_the_user_stopped_the_run() -> None:
    spec = service(replicas=2, retry=True)
    # replica 0 stopped through the agent (a rolling replacement, say), then replica 1 failed
    jobs = [
        job("terminated", "terminated_by_user", replica=0, ended_at=T - 100),
        exited(replica=1, ended_at=T),
    ]
    assert decide(spec, jobs, now=T + 20).action == "none"  # read from the jobs: a user stop
    assert decide(spec, jobs, now=T + 20, stopped_by_user=False).action == "resubmit"
    running = [job("running"), job("running", replica=1)]
    assert decide(spec, running, now=T, stopped_by_user=True).action == "none"
