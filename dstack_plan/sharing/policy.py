"""What an owner publishes in its state for the projects it exports fleets to: the `projects:`
section of its `.dstack/quotas.yml` (each importer's limits and fair share), so that an
importer's plan obeys them without reading the owner's files. The owner's apply publishes it
(`published`); importers read it from the owner's state (`limits_for`)."""

from __future__ import annotations

from pydantic import ValidationError

from dstack_plan.config.quotas import ProjectQuota, Quotas
from dstack_plan.errors import PlanError
from dstack_plan.state.model import JsonObject, State

PROJECTS_KEY = "projects"


def published(quotas: Quotas) -> JsonObject:
    """The policy `quotas` publishes (empty: nothing for other projects)."""
    if not quotas.projects:
        return {}
    projects: JsonObject = {
        name: quota.model_dump(mode="json", exclude_none=True)
        for name, quota in sorted(quotas.projects.items())
    }
    return {PROJECTS_KEY: projects}


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
