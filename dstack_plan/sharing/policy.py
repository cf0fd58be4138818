"""What an owner publishes in its state for the projects it exports fleets to: the `projects:`
section of its `.dstack/quotas.yml` (each importer's limits and fair share), so that an
importer's plan obeys them without reading the owner's files. The owner's apply publishes it
(`published`); importers read it from the owner's state (`limits_for`)."""

from __future__ import annotations

from pydantic import ValidationError

from dstack_plan.config.quotas import ProjectQuota, Quotas
from dstack_plan.errors import PlanError
from dstack_plan.state.model import JsonObject, JsonValue, State

PROJECTS_KEY = "projects"
WAITING_KEY = "waiting"
"""Per exported fleet, the GPUs each project under its guarantee waits for (what the owner's
watch is reclaiming for it): importers do not borrow them meanwhile (no preemption loop)."""


def published(quotas: Quotas, current: JsonObject | None = None) -> JsonObject:
    """The policy `quotas` publishes (empty: nothing for other projects); what the owner's
    watch publishes (`waiting`) is kept from `current`."""
    kept: JsonObject = {}
    if current and WAITING_KEY in current:
        kept[WAITING_KEY] = current[WAITING_KEY]
    if not quotas.projects:
        return kept
    projects: JsonObject = {
        name: quota.model_dump(mode="json", exclude_none=True)
        for name, quota in sorted(quotas.projects.items())
    }
    return {PROJECTS_KEY: projects, **kept}


def limits_for(owner: str, state: State, project: str) -> ProjectQuota | None:
    """The limits and fair share project `owner` (whose state is `state`) published for
    `project`; None when it published none."""
    projects = state.policy.get(PROJECTS_KEY)
    entry = projects.get(project) if isinstance(projects, dict) else None
    if entry is None:
        return None
    try:
        return ProjectQuota.model_validate(entry)
    except ValidationError as e:
        raise PlanError(
            f"project {owner!r} published limits for {project!r} this version cannot read: {e}"
        ) from None


def with_waiting(policy: JsonObject, waiting: dict[str, dict[str, float]]) -> JsonObject:
    """`policy` with `waiting` (fleet -> project -> GPUs) as the owner's watch found it."""
    kept: dict[str, JsonValue] = {
        fleet: dict(sorted(by_project.items())) for fleet, by_project in sorted(waiting.items())
        if by_project
    }  # fmt: skip
    rest = {k: v for k, v in policy.items() if k != WAITING_KEY}
    return {**rest, WAITING_KEY: kept} if kept else rest


def waiting_on(state: State, fleet: str) -> dict[str, float]:
    """Project -> GPUs it waits for on the owner's `fleet`, as the owner last published."""
    waiting = state.policy.get(WAITING_KEY)
    found = waiting.get(fleet) if isinstance(waiting, dict) else None
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) for k, v in found.items() if isinstance(v, int | float)}
