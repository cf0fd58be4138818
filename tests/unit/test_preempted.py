"""A job stopped as `preempted` (its capacity reclaimed): the agent's reason, and what the
run's own watch decides about it (watch/retry.py, watch/retries.py). A preemption ends the job
`terminated`, yet it is the retry event `interruption`: covered, the run waits `pending` and is
placed again; not covered, it ends `terminated` with the reason `preempted`. Other `terminated`
reasons are not failures, as before."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from dstack_plan.agent import protocol as p
from dstack_plan.agent.api_models import JobInfo, TerminationReason
from dstack_plan.clock import FakeClock
from dstack_plan.config.runs import RunSpec
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.state.model import ResourceState, State
from dstack_plan.watch import retries
from dstack_plan.watch.retry import PREEMPTED, JobOutcome, RetryState, backoff, decide_retry
from dstack_plan.watch.retry_model import preempted
from tests.unit.test_watch_policy_retry import service, task

T = 1_800_000_000.0
INTERRUPTION = {"retry": {"on_events": ["interruption"], "duration": "1h"}}
OTHER_TERMINATIONS = (
    p.TERMINATED_BY_USER,
    p.ABORTED_BY_USER,
    p.TERMINATED_BY_SERVER,
    p.SCALED_DOWN,
    p.MAX_DURATION_EXCEEDED,
    p.INACTIVITY_DURATION_EXCEEDED,
    p.TERMINATED_DUE_TO_UTILIZATION_POLICY,
)


def job(
    status: str, reason: str | None = None, *, replica: int = 0, node: int = 0, ended: float = T
) -> JobOutcome:
    return JobOutcome(
        job_id=f"j-{replica}-{node}",
        replica=replica,
        node=node,
        status=status,
        reason=reason,
        ended_at=None if status in ("running", "terminating") else ended,
    )


def was_preempted(**kw: Any) -> JobOutcome:
    return job("terminated", PREEMPTED, **kw)


def decide(spec: RunSpec, jobs: list[JobOutcome], now: float, **kw: Any) -> Any:
    state = kw.pop("state", None) or RetryState()
    return decide_retry(spec, jobs, state, now, submitted_at=T - 3600, **kw)


# -- the agent's reason ----------------------------------------------------------------------


def test_the_agent_accepts_preempted_as_a_stop_reason_that_ends_the_job_terminated() -> None:
    assert p.PREEMPTED == "preempted"
    assert p.PREEMPTED in p.STOP_REASONS
    assert p.STATUS_OF_REASON[p.PREEMPTED] == p.TERMINATED
    # every reason the agent can end a job with is one the client can read back
    assert set(p.STATUS_OF_REASON) == {r.value for r in TerminationReason}


def test_the_client_reads_a_preempted_job_and_watch_sees_an_interruption() -> None:
    info = JobInfo.model_validate(
        {
            "id": "train-0-0-0",
            "run_name": "train",
            "runtime": "process",
            "status": "terminated",
            "termination_reason": "preempted",
            "termination_message": "its capacity was reclaimed",
            "exit_code": 0,
            "submitted_at": T - 100,
            "finished_at": T,
        }
    )
    assert info.termination_reason is TerminationReason.PREEMPTED
    outcome = JobOutcome.of(JobRecord(id=info.id), info)
    assert outcome.preempted and outcome.failed and not outcome.user_stopped
    assert outcome.event == "interruption"
    assert outcome.ended_at == T
    # the record keeps the agent's message beside the reason, and still reads as preempted
    record = JobRecord(id=info.id, status="running").refreshed(info)
    assert record.reason == "preempted: its capacity was reclaimed"
    assert preempted(record.reason)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("preempted", True),
        ("preempted: its capacity was reclaimed", True),
        ("preempted_elsewhere", False),
        ("terminated_by_server: stopped by dstack watch", False),
        (None, False),
    ],
)
def test_which_reasons_are_preemptions(reason: str | None, expected: bool) -> None:
    assert preempted(reason) is expected


# -- the retry decision ----------------------------------------------------------------------


def test_a_preempted_job_with_retry_on_interruption_waits_pending_then_is_placed_again() -> None:
    spec = task(**INTERRUPTION)
    waiting = decide(spec, [was_preempted()], T + 1)
    assert waiting.action == "wait" and waiting.whole_run and waiting.preempted
    assert waiting.event == "interruption" and waiting.reason is None
    assert waiting.at == T + backoff(1)
    assert waiting.state.last_reason == PREEMPTED and waiting.state.last_failure_at == T
    assert "was preempted (interruption)" in waiting.message

    again = decide(spec, [was_preempted()], T + backoff(1), state=waiting.state)
    assert again.action == "resubmit" and again.whole_run and again.preempted
    assert again.slots == ((0, 0),) and again.stop == ()
    assert again.state.attempts == 1


def test_retry_true_covers_a_preemption() -> None:
    decision = decide(task(retry=True), [was_preempted()], T + 1)
    assert decision.action == "wait" and decision.preempted


@pytest.mark.parametrize(
    "fields",
    [{}, {"retry": {"on_events": ["error", "no-capacity"], "duration": "1h"}}],
    ids=["no retry", "retry not on interruption"],
)
def test_a_preempted_job_without_such_a_retry_ends_the_run_terminated_as_preempted(
    fields: dict[str, Any],
) -> None:
    decision = decide(task(**fields), [was_preempted()], T + 1)
    assert decision.action == "fail"
    assert decision.reason == "preempted" and decision.preempted
    assert decision.event == "interruption" and decision.stop == ()


def test_the_other_nodes_of_a_preempted_multi_node_task_are_stopped_with_it() -> None:
    jobs = [was_preempted(node=0), job("running", node=1)]
    waiting = decide(task(nodes=2, **INTERRUPTION), jobs, T + 1)
    assert waiting.action == "wait" and waiting.stop == ("j-0-1",)
    assert waiting.slots == ((0, 0), (0, 1))
    ended = decide(task(nodes=2), jobs, T + 1)
    assert ended.action == "fail" and ended.reason == "preempted" and ended.stop == ("j-0-1",)


def test_a_preempted_service_replica_is_resubmitted_alone_while_the_others_serve() -> None:
    spec = service(replicas=2, **INTERRUPTION)
    decision = decide(spec, [was_preempted(replica=0), job("running", replica=1)], T + 1)
    assert decision.action == "resubmit" and not decision.whole_run and decision.preempted
    assert decision.slots == ((0, 0),)


def test_a_failure_before_a_preemption_is_the_failure_it_was() -> None:
    # an error first: the run fails with job_failed, as before (retry covers no error)
    jobs = [
        job("failed", p.CONTAINER_EXITED_WITH_ERROR, node=0, ended=T - 5),
        was_preempted(node=1),
    ]
    decision = decide(task(nodes=2, **INTERRUPTION), jobs, T + 1)
    assert decision.action == "fail" and decision.reason == "job_failed"
    assert not decision.preempted


def test_a_user_stop_before_the_preemption_wins() -> None:
    jobs = [
        job("terminated", p.TERMINATED_BY_USER, node=0, ended=T - 5),
        was_preempted(node=1),
    ]
    assert decide(task(nodes=2, **INTERRUPTION), jobs, T + 1).action == "none"


@pytest.mark.parametrize("reason", OTHER_TERMINATIONS)
@pytest.mark.parametrize("retry", [None, True, {"on_events": ["interruption"]}])
def test_other_terminated_reasons_are_never_retried(reason: str, retry: object) -> None:
    status = p.STATUS_OF_REASON[reason]
    outcome = job(status, reason)
    assert not outcome.failed and not outcome.preempted
    fields = {} if retry is None else {"retry": retry}
    decision = decide(task(**fields), [outcome], T + 1)
    assert decision.action == "none" and not decision.preempted and decision.reason is None


# -- carrying it out (watch/retries.py) ------------------------------------------------------


def run_entry(status: str, jobs: list[JobRecord], **attributes: Any) -> ResourceState:
    now = datetime.fromtimestamp(T - 60, tz=timezone.utc)
    record = RunRecord(generation=1).with_jobs(jobs)
    return ResourceState(
        kind="task",
        name="train",
        provider="local",
        spec={"type": "task", "name": "train", "commands": ["x"]},
        attributes={**record.to_json(), **attributes},
        status=status,
        created_at=now,
        updated_at=now,
    )


@pytest.mark.parametrize(
    ("status", "reason", "looked_at"),
    [
        ("failed", "container_exited_with_error: exited with code 3", True),
        ("terminated", "preempted: its capacity was reclaimed", True),
        ("terminated", "preempted", True),
        ("terminating", None, False),
        ("running", None, False),
        *[
            ("terminated", f"{r}: why", False)
            for r in OTHER_TERMINATIONS
            if r != p.ABORTED_BY_USER
        ],
        ("aborted", "aborted_by_user: aborted by user", False),
    ],
)
def test_which_job_records_the_retry_policy_looks_at(
    status: str, reason: str | None, looked_at: bool
) -> None:
    assert retries._failed(status, reason) is looked_at


def carry_out(run: ResourceState, decision: Any, read: ResourceState) -> ResourceState | None:
    project: Any = SimpleNamespace(clock=FakeClock(T + 1))
    state = State.empty().with_resource(read)
    ctx: Any = None  # no job to stop or start in these decisions
    return asyncio.run(retries._carry_out(project, run, decision, ctx, state))


def test_a_retried_preemption_puts_the_run_back_to_pending_and_an_uncovered_one_ends_it() -> None:
    old = JobRecord(id="train-0-0-0", status="running")
    ended = old._replace(status="terminated", reason="preempted: its capacity was reclaimed")
    read = run_entry("running", [old])
    refreshed = run_entry("terminated", [ended])

    waiting = decide(task(**INTERRUPTION), [was_preempted()], T + 1)
    entry = carry_out(refreshed, waiting, read)
    assert entry is not None and entry.status == "pending"
    assert "termination_reason" not in entry.attributes
    assert entry.attributes["retry"]["next_attempt_at"] == T + backoff(1)
    assert RunRecord.of(entry).jobs == (ended,)  # placed again once the backoff is over

    given_up = decide(task(), [was_preempted()], T + 1)
    entry = carry_out(refreshed, given_up, read)
    assert entry is not None and entry.status == "terminated"
    assert entry.attributes["termination_reason"] == "preempted"


def test_a_failed_run_waits_for_its_retry_as_pending_and_fails_without_one() -> None:
    old = JobRecord(id="train-0-0-0", status="running")
    ended = old._replace(status="failed", reason="container_exited_with_error: exited with 3")
    read, refreshed = run_entry("running", [old]), run_entry("failed", [ended])
    error = job("failed", p.CONTAINER_EXITED_WITH_ERROR)
    waiting = carry_out(refreshed, decide(task(retry=True), [error], T + 1), read)
    assert waiting is not None and waiting.status == "pending"  # dstack's: not failed yet
    failed = carry_out(refreshed, decide(task(), [error], T + 1), read)
    assert failed is not None and failed.status == "failed"
    assert failed.attributes["termination_reason"] == "job_failed"


def test_a_preempted_job_gone_in_the_tick_that_saw_it_end_still_has_its_event() -> None:
    old = JobRecord(id="train-0-0-0", status="running")
    ended = old._replace(status="terminated", reason="preempted: its capacity was reclaimed")
    read = State.empty().with_resource(run_entry("running", [old]))
    refreshed = State.empty().with_resource(run_entry("terminated", [ended]))
    new = JobRecord(id="train-0-0-1", status="running")
    placed = run_entry("running", [new]).updated(
        now=datetime.fromtimestamp(T, tz=timezone.utc),
        attributes={**RunRecord(generation=2).with_jobs([new]).to_json()},
    )
    (event,) = retries.preempted_events(read, refreshed, {"task.train": placed}, T + 1)
    assert (event.kind, event.job_id, event.old_status, event.new_status) == (
        "job",
        "train-0-0-0",
        "running",
        "terminated",
    )
    assert event.reason == "preempted: its capacity was reclaimed"
    # still there (the run waits): the loop's own status change of the job says it
    pending = run_entry("pending", [ended])
    assert retries.preempted_events(read, refreshed, {"task.train": pending}, T + 1) == []
    # seen ended at an earlier tick already: said then
    seen = State.empty().with_resource(run_entry("pending", [ended]))
    assert retries.preempted_events(seen, refreshed, {"task.train": placed}, T + 1) == []
