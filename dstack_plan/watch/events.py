"""The events one tick's observations make: a run or a job whose status changed (pure)."""

from __future__ import annotations

from dstack_plan.apply.run_records import RunRecord
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.state.events import Event, span_id
from dstack_plan.state.model import State


def status_events(before: State, after: State, now: float) -> list[Event]:
    """One event per run whose status moved from `before` to `after`, and one per job of it
    whose status moved; all of a run object's events share its span id."""
    events: list[Event] = []
    for address, run in after.resources.items():
        old = before.resources.get(address)
        if run.kind not in RUN_KINDS or old is None:
            continue
        record = RunRecord.of(run)
        span = span_id(address, record.generation or run.created_at)
        old_jobs = {j.id: j.status for j in RunRecord.of(old).jobs}
        for job in record.jobs:
            was = old_jobs.get(job.id)
            if was != job.status:
                events.append(
                    Event(
                        time=now,
                        address=address,
                        kind="job",
                        span_id=span,
                        old_status=was,
                        new_status=job.status,
                        job_id=job.id,
                    )
                )
        if old.status != run.status:
            events.append(
                Event(
                    time=now,
                    address=address,
                    kind="run",
                    span_id=span,
                    old_status=old.status,
                    new_status=run.status,
                )
            )
    return events
