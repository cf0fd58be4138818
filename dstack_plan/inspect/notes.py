"""What `ps` says about a run beside its status, from what watch and apply keep in its state
attributes: a retry's next attempt, a queue wait, a cron schedule, a service's scaling, a
rolling update in progress. Pure: times are shown in this machine's local time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dstack_plan.runs.records import service_url
from dstack_plan.runs.rollout import progress_note
from dstack_plan.runs.scaling import ScalingRecord
from dstack_plan.state.model import ResourceState

NO_WATCH = "no dstack watch runs"


def run_notes(
    entry: ResourceState,
    attributes: dict[str, Any] | None = None,
    served: bool = True,
    watching: bool = True,
    status: str | None = None,
) -> list[str]:
    """The notes for run `entry` (with `attributes` and `status` as refreshed, when given),
    in order. `served`: the `dstack watch` that recorded the service's URL leads, so the URL
    answers; `watching`: some watch leads (one must, to retry a run or serve a service)."""
    attributes = entry.attributes if attributes is None else attributes
    notes = []
    retry = _dict(attributes.get("retry"))
    at = _number(retry.get("next_attempt_at"))
    if at is not None:
        due = f"retrying at {clock_time(at)}"
        notes.append(due if watching else f"{due}: {NO_WATCH} to retry it (`dstack watch`)")
    elif not watching and (status or entry.status) == "failed" and _unseen_retry(entry, retry):
        notes.append(f"{NO_WATCH} to apply its retry (`dstack watch`)")
    queued = _dict(attributes.get("queued"))
    if queued:
        why = queued.get("why")
        notes.append(f"waiting for capacity: {why}" if why else "waiting for capacity")
    schedule = _dict(attributes.get("schedule"))
    next_run = _number(schedule.get("next_run_at"))
    if next_run is not None:
        notes.append(f"next run {clock_time(next_run, seconds=False)}")
    notes += _serving(entry, served, watching)
    scaling = scaling_note(entry.model_copy(update={"attributes": attributes}))
    if scaling:
        notes.append(scaling)
    rollout = progress_note(entry.model_copy(update={"attributes": attributes}))
    if rollout:
        notes.append(rollout)
    return notes


def _unseen_retry(entry: ResourceState, retry: dict[str, Any]) -> bool:
    """The run has a `retry` policy and no watch has judged its failure yet (a watch that
    did keeps `last_failure_at`, and gave up if it left the run failed)."""
    return bool(entry.spec.get("retry")) and "last_failure_at" not in retry


def _serving(entry: ResourceState, served: bool, watching: bool) -> list[str]:
    """How a service is reached, or why it is not."""
    if entry.kind != "service" or entry.status in ("terminated", "failed", "done"):
        return []
    url = service_url(entry)
    if url and served:
        return [f"serving {url}"]
    if not watching:
        where = f" ({url})" if url else ""
        return [f"not served: {NO_WATCH}{where}; `dstack watch` serves it on 127.0.0.1:3000"]
    if url:  # another watch leads than the one that recorded it: started with --no-serve
        return ["not served by the watch that leads (it runs with --no-serve)"]
    return []  # a watch leads and routes it from its next tick


def scaling_note(entry: ResourceState) -> str | None:
    """For a service with `scaling`: the replicas the autoscaler keeps and why, from the
    record of the watch that scales it (`watch/autoscale.py`); that it keeps the minimum
    when no watch serves it (only a serving watch sees the requests)."""
    scaling = entry.spec.get("scaling") if entry.kind == "service" else None
    if not isinstance(scaling, dict):
        return None
    target = scaling.get("target")
    record = ScalingRecord.of(entry.attributes)
    if record is None:
        replicas = str(entry.spec.get("replicas", "1"))
        low, _, _high = replicas.partition("..")
        kept = max(int(low), 1) if low.isdigit() else 1
        return (
            f"scaling by {scaling.get('metric', 'rps')} needs a serving `dstack watch`: "
            f"keeps {kept} replica{'s' if kept != 1 else ''} (replicas {replicas})"
        )
    shown = f"{target:g}" if isinstance(target, (int, float)) else target
    note = f"replicas {record.desired}: {record.rps:g} req/s, target {shown}/replica"
    if record.held_by is not None and record.wanted != record.desired:
        until = f" until {clock_time(record.held_until)}" if record.held_until else ""
        note += f"; {record.wanted} wanted, held by {record.held_by}{until}"
    return note


def clock_time(epoch: float, seconds: bool = True) -> str:
    """`HH:MM:SS` (or `HH:MM`) in local time."""
    return datetime.fromtimestamp(epoch).strftime("%H:%M:%S" if seconds else "%H:%M")


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
