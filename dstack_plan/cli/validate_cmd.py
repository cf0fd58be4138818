"""`dstack validate`: load and check configuration files and policy files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli.policy_view import PolicyOpt

if TYPE_CHECKING:
    from dstack_plan.config.resource import Desired
    from dstack_plan.errors import ConfigIssue


def validate(
    directory: Path = typer.Argument(Path("."), help="Project directory."),
    files: list[str] = typer.Option(
        [], "-f", "--file", help="A configuration file (repeatable; '-' reads stdin)."
    ),
    policy: list[str] = PolicyOpt,
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable result."),
) -> None:
    """Check configuration files and policy files and report every problem with its location.

    Checks everything `plan` checks without state or agents: the files, then references
    between resources, dependency cycles and the limits dstack's server checks (with the
    same functions `plan` uses); and every rule of the policy files (`--policy` and the
    project's `.dstack/policies/`): its fields, the syntax of its expression and the names
    it uses.
    """
    from dstack_plan.cli.output import print_error, print_json
    from dstack_plan.config.loader import load_project
    from dstack_plan.errors import ConfigError
    from dstack_plan.plan.limits import checked_dependencies
    from dstack_plan.policy.check import check_policy_files

    issues: list[ConfigIssue] = []
    warnings: list[ConfigIssue] = []
    desired = None
    try:
        desired = load_project(directory, files)
        # files given alone (dstack's docs are full of them) may name what the project's
        # state holds, or what plan resolves later: a warning, never an error
        unresolved = warnings if files else None
        known = _state_addresses(directory) if files else ()
        checked_dependencies(desired, directory, unresolved=unresolved, known=known)
        if files:  # other projects' fleets and gateways, as `.dstack/projects.yml` finds them
            warnings += _imported_warnings(desired, directory)
    except ConfigError as e:
        issues += e.issues
    rules = []
    try:
        rules = check_policy_files(directory, policy)
    except ConfigError as e:
        issues += e.issues
    if issues or desired is None:
        if as_json:
            print_json(
                {
                    "valid": False,
                    "resources": [],
                    "presets": [],
                    "policies": [],
                    "errors": [
                        {"file": i.file, "line": i.line, "column": i.column, "message": i.message}
                        for i in issues
                    ],
                }
            )
        else:
            print_error(ConfigError(issues))
        raise typer.Exit(1) from None
    if as_json:
        print_json(
            {
                "valid": True,
                "resources": [
                    {"address": r.address, "kind": r.kind, "name": r.name, "file": r.source.file}
                    for r in desired
                ],
                # presets are checked configurations, not resources (never planned)
                "presets": [
                    {"name": r.name, "file": r.source.file} for r in desired.presets.values()
                ],
                "policies": [
                    {"name": r.rule.name, "file": r.file, "severity": r.rule.severity}
                    for r in rules
                ],
                "errors": [],
                "warnings": [
                    {"file": i.file, "line": i.line, "column": i.column, "message": i.message}
                    for i in warnings
                ],
            }
        )
        return
    for warning in warnings:
        typer.echo(str(warning).replace(": error: ", ": warning: ", 1), err=True)
    checked = [_count(len(desired), "resource")]
    checked += [_count(len(desired.presets), "preset")] if desired.presets else []
    checked += [_count(len(rules), "policy rule")] if rules else []
    head = ", ".join(checked[:-1])
    typer.echo(f"{head} and {checked[-1]} OK" if head else f"{checked[0]} OK")


def _imported_warnings(desired: Desired, directory: Path) -> list[ConfigIssue]:
    from dstack_plan.config.project_name import own_project_name
    from dstack_plan.sharing.imports import Imports
    from dstack_plan.sharing.references import imported_reference_warnings

    imports = Imports(directory, own_project_name(directory))
    return imported_reference_warnings(desired, imports, directory)


def _state_addresses(directory: Path) -> frozenset[str]:
    """What the project's state holds, read-only; nothing when it cannot be read (validate
    needs no state: it only decides between a warning and silence)."""
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.state.select import open_backend

    try:
        return frozenset(open_backend(directory).read().state.resources)
    except DstackPlanError:
        return frozenset()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"
