"""The entry point the CLI uses: find the policy files of a plan and check it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from dstack_plan.policy.loader import load_rules, policy_paths

if TYPE_CHECKING:
    from dstack_plan.plan.model import Plan
    from dstack_plan.plan.policy_report import PolicyReport
    from dstack_plan.policy.model import LoadedRule


def check_plan(
    plan: Plan, project_dir: str | Path, explicit: Iterable[str] = ()
) -> PolicyReport | None:
    """The report of checking `plan` against the policy files `explicit` (as given) and the
    project's `.dstack/policies/`; None when there are none (CEL is not even imported)."""
    files = policy_paths(project_dir, explicit)
    if not files:
        return None
    from dstack_plan.plan.json_plan import plan_to_json
    from dstack_plan.policy.evaluate import evaluate

    return evaluate(load_rules(files), plan_to_json(plan))


def check_policy_files(project_dir: str | Path, explicit: Iterable[str] = ()) -> list[LoadedRule]:
    """Every rule of the policy files `explicit` and the project's `.dstack/policies/`, each
    expression compiled and its names checked, without a plan (`dstack validate`);
    ConfigError (FILE:LINE:COL) for every problem. CEL is imported only when there are files."""
    files = policy_paths(project_dir, explicit)
    if not files:
        return []
    from dstack_plan.policy.evaluate import compile_rules

    rules = load_rules(files)
    compile_rules(rules)
    return rules
