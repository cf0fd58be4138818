"""`dstack plan`: show what apply would change."""

from __future__ import annotations

from pathlib import Path

import typer

from dstack_plan.cli import common


def _labels(values: list[str]) -> list[str]:
    from dstack_plan.config.label_options import parse_label

    for value in values:
        try:
            parse_label(value)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    return values


LabelOpt = typer.Option(
    [],
    "--label",
    metavar="KEY=VALUE",
    callback=_labels,
    help="Require hosts labelled KEY=VALUE for every run (repeatable; kept in a saved plan).",
)


def labels_of(values: list[str]) -> dict[str, str]:
    """The `--label` options as a mapping (a key given twice takes its last value)."""
    from dstack_plan.config.label_options import parse_label

    return dict(parse_label(v) for v in values)


def plan(
    directory: Path = common.DirArg,
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
    target: list[str] = common.TargetOpt,
    replace: list[str] = common.ReplaceOpt,
    allow_destroy: list[str] = common.AllowDestroyOpt,
    label: list[str] = LabelOpt,
    destroy: bool = typer.Option(False, "--destroy", help="Plan to destroy everything."),
    out: str = typer.Option(None, "-out", "--out", help="Save the plan to FILE for apply."),
    as_json: bool = common.JsonOpt,
    detailed_exitcode: bool = typer.Option(
        False, "--detailed-exitcode", help="Exit 0: no changes, 1: error, 2: changes present."
    ),
) -> None:
    """Show the changes apply would make, where runs go and what they cost."""
    from dstack_plan.cli.output import print_json, print_lines, progress
    from dstack_plan.cli.plan_view import render_plan
    from dstack_plan.plan.planner import PlanOptions

    project = common.make_project(directory, files, state)
    project.labels = labels_of(label)
    if not destroy:
        common.require_configuration(project)
    options = PlanOptions(
        destroy=destroy,
        targets=tuple(target),
        replace=tuple(replace),
        allow_destroy_protected=tuple(allow_destroy),
    )
    with progress("Refreshing state and planning..."):
        result, _ = common.run_with(project, lambda p: p.plan(options))
    if out:
        from dstack_plan.plan.planfile import save_plan

        save_plan(result, out)
    if as_json:
        from dstack_plan.plan.json_plan import plan_to_json

        print_json(plan_to_json(result))
    else:
        print_lines(render_plan(result))
        if out:
            print_lines(["", f"Saved the plan to: {out}", f"To apply it, run: dstack apply {out}"])
    if detailed_exitcode and result.has_changes:
        raise typer.Exit(2)
