"""`dstack plan`: show what apply would change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dstack_plan.cli import common
from dstack_plan.cli.policy_view import PolicyOpt, check_policies, enforce


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


def _format(value: str) -> str:
    if value not in FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(FORMATS)}")
    return value


FORMATS = ("text", "json", "markdown")
FormatOpt = typer.Option(
    "text",
    "--format",
    metavar="text|json|markdown",
    callback=_format,
    help="Output: the terminal plan, the JSON plan (as --json) or a pull-request comment.",
)
MarkdownOpt = typer.Option(
    None,
    "--markdown",
    metavar="FILE",
    help="Also write the plan as a pull-request comment (Markdown) to FILE.",
)


def write_markdown(document: dict[str, Any], path: str) -> None:
    """Write the JSON plan `document` as Markdown to `path`."""
    from dstack_plan.errors import PlanError
    from dstack_plan.plan.markdown import render_markdown

    try:
        Path(path).write_text(render_markdown(document))
    except OSError as e:
        raise PlanError(f"cannot write the markdown plan to {path}: {e.strerror}") from None


def plan(
    directory: Path = common.DirArg,
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
    target: list[str] = common.TargetOpt,
    replace: list[str] = common.ReplaceOpt,
    allow_destroy: list[str] = common.AllowDestroyOpt,
    prune: bool = common.PruneOpt,
    label: list[str] = LabelOpt,
    policy: list[str] = PolicyOpt,
    destroy: bool = typer.Option(False, "--destroy", help="Plan to destroy everything."),
    out: str = typer.Option(None, "-out", "--out", help="Save the plan to FILE for apply."),
    as_json: bool = common.JsonOpt,
    output_format: str = FormatOpt,
    markdown: str = MarkdownOpt,
    detailed_exitcode: bool = typer.Option(
        False,
        "--detailed-exitcode",
        help="Exit 0: no changes, 1: error or denied by policy, 2: changes present.",
    ),
) -> None:
    """Show the changes apply would make, where runs go and what they cost."""
    from dstack_plan.cli.output import print_json, print_lines, progress
    from dstack_plan.plan.planner import PlanOptions
    from dstack_plan.plan.render import render_plan

    project = common.make_project(directory, files, state)
    project.labels = labels_of(label)
    if not destroy:
        common.require_configuration(project)
    options = PlanOptions(
        destroy=destroy,
        targets=tuple(target),
        replace=tuple(replace),
        allow_destroy_protected=tuple(allow_destroy),
        prune=prune,
    )
    with common.nothing_changed_on_interrupt(), progress("Refreshing state and planning..."):
        result, _ = common.run_with(project, lambda p: p.plan(options))
    report = check_policies(result, directory, policy)
    if out:
        from dstack_plan.plan.planfile import save_plan

        save_plan(result, out, report)
    shown = "json" if as_json else output_format
    if shown != "text" or markdown:
        from dstack_plan.plan.json_plan import plan_to_json

        # markdown renders this, so it shows what --json does
        document = plan_to_json(result, report)
        if markdown:
            write_markdown(document, markdown)
    if shown == "markdown":
        from dstack_plan.plan.markdown import render_markdown

        typer.echo(render_markdown(document), nl=False)
    elif shown == "json":
        print_json(document)
    else:
        print_lines(render_plan(result))
        if out:
            print_lines(["", f"Saved the plan to: {out}", f"To apply it, run: dstack apply {out}"])
    enforce(report, stderr=shown != "text")  # a denied plan exits 1 whatever the flags say
    if detailed_exitcode and result.has_changes:
        raise typer.Exit(2)
