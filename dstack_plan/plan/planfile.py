"""Saved plans (`dstack plan -out FILE`) and the checks before applying one."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from dstack_plan.errors import PlanError
from dstack_plan.plan.model import PLAN_FORMAT_VERSION, Plan
from dstack_plan.plan.policy_report import PolicyReport
from dstack_plan.state.backend import StateSnapshot

_KIND = "dstack-plan saved plan"


def save_plan(plan: Plan, path: str | Path, policy: PolicyReport | None = None) -> None:
    """Write the plan (names of secrets only, never values), readable by the owner only,
    with the results of the policy checks it passed through (`policy`), if any."""
    payload: dict[str, object] = {"kind": _KIND, "plan": plan.model_dump(mode="json")}
    if policy is not None:
        payload["policy"] = policy.to_json()
    text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def load_plan(path: str | Path) -> Plan:
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"cannot read saved plan {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{path} is not a saved plan (invalid JSON at line {e.lineno})") from None
    if not isinstance(payload, dict) or payload.get("kind") != _KIND:
        raise PlanError(f"{path} is not a saved plan made by `dstack plan -out`")
    try:
        plan = Plan.model_validate(payload.get("plan"))
    except ValidationError as e:
        raise PlanError(f"{path}: damaged saved plan ({e.error_count()} problems)") from None
    if plan.format_version.split(".")[0] != PLAN_FORMAT_VERSION.split(".")[0]:
        raise PlanError(f"{path}: plan format {plan.format_version} is not supported")
    return plan


def load_policy_record(path: str | Path) -> PolicyReport | None:
    """The policy results recorded in saved plan `path` (None: it was not checked against
    any policy); call after `load_plan`, which reports unreadable files."""
    payload = json.loads(Path(path).read_text())
    record = payload.get("policy")
    if record is None:
        return None
    try:
        return PolicyReport.model_validate(record)
    except ValidationError as e:
        raise PlanError(f"{path}: damaged policy results ({e.error_count()} problems)") from None


def check_not_stale(plan: Plan, snapshot: StateSnapshot, path: str | Path) -> None:
    """Refuse a plan made against another history or an older version of the state."""
    state = snapshot.state
    if plan.lineage and snapshot.exists and plan.lineage != state.lineage:
        raise PlanError(
            f"saved plan {path} does not match the state: it was made for lineage "
            f"{plan.lineage}, the state has lineage {state.lineage}"
        )
    current_serial = state.serial if snapshot.exists else 0
    if plan.serial != current_serial or (not plan.lineage and snapshot.exists and state.serial):
        raise PlanError(
            f"saved plan {path} is stale: it was made against state serial {plan.serial}, "
            f"the state is now at serial {current_serial}; run `dstack plan` again"
        )
