"""`--policy` for plan and apply: checking a plan, printing the outcome, failing a denied one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from dstack_plan.plan.lines import Line
    from dstack_plan.plan.model import Plan
    from dstack_plan.plan.policy_report import PolicyReport

PolicyOpt = typer.Option(
    [],
    "--policy",
    metavar="FILE",
    help="Check the plan against the rules of policy FILE (repeatable; the project's "
    ".dstack/policies/*.yml are always checked).",
)


def check_policies(plan: Plan, project_dir: Path, files: list[str]) -> PolicyReport | None:
    """The plan checked against `files` and the project's policies (None: there are none)."""
    if not files and not (project_dir / ".dstack" / "policies").is_dir():
        return None  # nothing to check: not even the policy package is imported
    from dstack_plan.policy.check import check_plan

    return check_plan(plan, project_dir, files)


def policy_lines(report: PolicyReport) -> list[Line]:
    """`Policy: 3 rules checked, 1 denied, 1 warning.` and a line per failed rule."""
    from dstack_plan.plan.lines import styled

    denied, warned = report.failed("deny"), report.failed("warn")
    lines: list[Line] = []
    for result in denied:
        where = f"{result.name} ({result.file})"
        lines.append((styled("Denied:", "bold red"), f" {where}: {result.message}"))
    for result in warned:
        where = f"{result.name} ({result.file})"
        lines.append((styled("Warning:", "bold yellow"), f" {where}: {result.message}"))
    count = len(report.rules)
    summary = (
        f"Policy: {count} rule{'' if count == 1 else 's'} checked, {len(denied)} denied, "
        f"{len(warned)} warning{'' if len(warned) == 1 else 's'}."
    )
    lines.append((styled(summary, "bold red" if report.denied else "bold"),))
    return lines


def enforce(report: PolicyReport | None, *, stderr: bool = False) -> None:
    """Print the outcome of the checks (`stderr`: stdout holds JSON or Markdown), and exit 1
    naming every failed deny rule when the plan is denied."""
    if report is None:
        return
    from dstack_plan.cli.output import print_lines

    print_lines(["", *policy_lines(report)], stderr=stderr)
    if report.denied:
        from dstack_plan.policy.evaluate import PolicyError

        names = ", ".join(r.name for r in report.failed("deny"))
        raise PolicyError(f"the plan is denied by policy: {names}")
