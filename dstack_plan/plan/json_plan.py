"""The machine-readable plan, modelled on Terraform's `show -json` (see docs/plan-json.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dstack_plan.plan.model import Plan, ResourceChange

if TYPE_CHECKING:
    from dstack_plan.plan.policy_report import PolicyReport


def plan_to_json(plan: Plan, policy: PolicyReport | None = None) -> dict[str, Any]:
    """The JSON plan; with `policy` (the plan was checked against policy files), a `policy`
    section: `{"rules": [{name, file, severity, outcome, message}], "denied": bool}`."""
    add, change, destroy = plan.counts()
    document: dict[str, Any] = {
        "format_version": plan.format_version,
        "applyable": plan.has_changes,
        "complete": not plan.targets,
        "destroy": plan.destroy,
        "prior_state": {"lineage": plan.lineage, "serial": plan.serial},
        "resource_changes": [_resource_change(c) for c in plan.changes],
        "summary": {"add": add, "change": change, "destroy": destroy},
        "cost": {
            "currency": "USD",
            "period": "hour",
            "before": plan.cost.before,
            "after": plan.cost.after,
        },
        "targets": list(plan.targets),
        "replace": list(plan.replace),
        "warnings": list(plan.warnings),
        "submission": plan.submission,
        "kept_submitted": list(plan.kept),
    }
    if policy is not None:
        document["policy"] = policy.to_json()
    return document


def _resource_change(change: ResourceChange) -> dict[str, Any]:
    placement = change.placement
    return {
        "address": change.address,
        "type": change.kind,
        "name": change.name,
        "provider_name": change.provider,
        "change": {
            "actions": change.action.terraform_actions,
            "before": change.before,
            "after": change.after,
            "changed_paths": [p.split(".") for p in change.changed_paths],
            "replace_paths": [p.split(".") for p in change.replace_paths],
            "sensitive_secrets": list(change.secrets),
        },
        "action_reason": change.action_reason,
        "reason": change.reason,
        "depends_on": list(change.depends_on),
        "submitted": change.submitted,
        "placement": None if placement is None else placement.model_dump(mode="json"),
    }
