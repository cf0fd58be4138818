"""Which agent jobs deleting a run removes: its own, orphans of a create cut short, and never
those of the object that replaced it (create-before-destroy)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.runs.ownership import jobs_to_remove as _jobs_to_remove
from dstack_plan.state import ResourceState

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
NOW_MS = int(NOW.timestamp() * 1000)
DEPLOYMENT = "abc123"


def job(job_id: str, generation: int | None, deployment: str = DEPLOYMENT) -> JobInfo:
    labels: dict[str, Any] = {"deployment": deployment}
    if generation is not None:
        labels["generation"] = str(generation)
    return JobInfo(
        id=job_id,
        run_name="web",
        runtime="process",
        status="running",
        submitted_at=1.0,
        spec={"labels": labels},
    )


def run(generation: int | None, *job_ids: str, tainted: bool = False) -> ResourceState:
    attributes: dict[str, Any] = {}
    if generation is not None:
        attributes = {"generation": generation, "jobs": [{"id": i} for i in job_ids]}
    return ResourceState.create(
        "service.web",
        provider="local",
        spec={"type": "service"},
        status="running",
        now=NOW,
        attributes=attributes,
        tainted=tainted,
    )


LISTED = [
    job("web-0-0-100-abc123", 100),  # the old object's
    job("web-1-0-100-abc123", 100),  # the old object's, added by scaling, not yet recorded
    job("web-0-0-200-abc123", 200),  # the replacement's
    job("web-0-0-50-abc123", 50),  # an orphan of an earlier create cut short
    job("web-0-0-100-zzz999", 100, deployment="zzz999"),  # another project's run "web"
]


def test_a_plain_delete_takes_its_generation_and_unlabelled_orphans_only() -> None:
    old = run(100, "web-0-0-100-abc123")
    assert _jobs_to_remove(old, LISTED, DEPLOYMENT, None) == {
        "web-0-0-100-abc123",
        "web-1-0-100-abc123",
    }


def test_a_deposed_object_spares_its_replacement() -> None:
    old = run(100, "web-0-0-100-abc123")
    new = run(200, "web-0-0-200-abc123")
    removed = _jobs_to_remove(old, LISTED, DEPLOYMENT, new)
    assert removed == {"web-0-0-100-abc123", "web-1-0-100-abc123"}


def test_a_create_cut_short_loses_its_orphans_but_not_the_replacement() -> None:
    # the intent, committed at NOW: no generation, no jobs recorded; its create took the
    # generation from the clock afterwards, so its orphans are no older than the intent
    cut_short = run(None, tainted=True)
    orphan = job(f"web-0-0-{NOW_MS + 40}-abc123", NOW_MS + 40)
    new = run(NOW_MS + 900, f"web-0-0-{NOW_MS + 900}-abc123")
    later = [
        orphan,
        job(f"web-0-0-{NOW_MS + 900}-abc123", NOW_MS + 900),  # the replacement's
        job(f"web-0-0-{NOW_MS + 40}-zzz999", NOW_MS + 40, deployment="zzz999"),
    ]
    # older jobs of the run are another object's (or another project's): never the intent's
    assert _jobs_to_remove(cut_short, [*LISTED, *later], DEPLOYMENT, new) == {orphan.id}
    # with nothing replacing it (delete-then-create, destroy), every later job of its key goes
    alone = _jobs_to_remove(cut_short, [*LISTED, *later], DEPLOYMENT, None)
    assert alone == {orphan.id, f"web-0-0-{NOW_MS + 900}-abc123"}


def test_jobs_from_before_the_generation_label_still_go() -> None:
    old = run(100, "web-0-0-100-abc123")
    # their generation is in their id: the run's own goes, another generation's stays
    unlabelled = [job("web-1-0-100-abc123", None), job("web-0-0-7-abc123", None)]
    assert _jobs_to_remove(old, unlabelled, DEPLOYMENT, None) == {
        "web-0-0-100-abc123",
        "web-1-0-100-abc123",
    }
