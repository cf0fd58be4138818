"""The events one tick's observations make (pure), and their structured log lines.

`status_events` finds a run or a job whose status changed. `log_events` writes each event as a
log record carrying the logging convention's fields (event `status_changed`, the address, job,
host, resource type and span id), at the level `event_level` gives, so `dstack watch
--log-format json` shows what watch saw and did; `LoggedEventLog` does it for every event
watch records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from dstack_plan.agent.protocol import FINISHED_STATUSES
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.runs.records import RunRecord, run_span_id
from dstack_plan.state.events import Event, EventLog, event_level, event_message, span_id
from dstack_plan.state.model import ResourceState, State

log = logging.getLogger(__name__)

STATUS_CHANGED = "status_changed"


def status_events(before: State, after: State, now: float) -> list[Event]:
    """One event per run whose status moved from `before` to `after`, and one per job of it
    whose status moved; all of a run object's events share its span id."""
    events: list[Event] = []
    for address, run in after.resources.items():
        old = before.resources.get(address)
        if run.kind not in RUN_KINDS or old is None:
            continue
        record = RunRecord.of(run)
        span = run_span_id(run)
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
                        host=job.host,
                        reason=job.reason if job.status in FINISHED_STATUSES else None,
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
                    reason=_run_reason(run.attributes.get("termination_reason")),
                )
            )
    return events


def host_event(
    now: float,
    fleet: ResourceState,
    old: str | None,
    new: str,
    reason: str | None,
    host: str | None = None,
) -> Event:
    """A host of `fleet` (its entry) moving from `old` to `new`, for the event log."""
    return Event(
        time=now,
        address=fleet.address,
        kind="host",
        span_id=span_id(fleet.address, fleet.created_at),
        old_status=old,
        new_status=new,
        reason=reason,
        host=host,
    )


def _run_reason(raw: object) -> str | None:
    return raw if isinstance(raw, str) else None


def log_events(events: Iterable[Event]) -> None:
    """One log record per event, with the convention's `extra=` fields."""
    for event in events:
        level = getattr(logging, event_level(event).upper())
        log.log(
            level,
            "%s%s: %s",
            event.address,
            f" {event.job_id}" if event.job_id else "",
            event_message(event),
            extra={
                "event": STATUS_CHANGED,
                "address": event.address,
                "job_id": event.job_id,
                "host": event.host,
                "resource_type": event.kind,
                "span_id": event.span_id,
            },
        )


class LoggedEventLog(EventLog):
    """An event log that also logs every event appended to it (see `log_events`)."""

    def append(self, events: Iterable[Event]) -> None:
        """Log the events (cut and cleared of secrets as the log stores them), then add them."""
        batch = [self._clean(e) for e in events]
        log_events(batch)
        super().append(batch)
