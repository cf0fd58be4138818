"""`dstack validate`: load and check configuration files."""

from __future__ import annotations

from pathlib import Path

import typer


def validate(
    directory: Path = typer.Argument(Path("."), help="Project directory."),
    files: list[str] = typer.Option(
        [], "-f", "--file", help="A configuration file (repeatable; '-' reads stdin)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable result."),
) -> None:
    """Check configuration files and report every problem with its location.

    Checks everything `plan` checks without state or agents: the files, then references
    between resources, dependency cycles and the limits dstack's server checks (with the
    same functions `plan` uses).
    """
    from dstack_plan.cli.output import print_error, print_json
    from dstack_plan.config.loader import load_project
    from dstack_plan.errors import ConfigError
    from dstack_plan.plan.limits import checked_dependencies

    try:
        desired = load_project(directory, files)
        checked_dependencies(desired, directory)
    except ConfigError as e:
        if as_json:
            print_json(
                {
                    "valid": False,
                    "resources": [],
                    "presets": [],
                    "errors": [
                        {"file": i.file, "line": i.line, "column": i.column, "message": i.message}
                        for i in e.issues
                    ],
                }
            )
        else:
            print_error(e)
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
                "errors": [],
            }
        )
        return
    count = len(desired)
    presets = len(desired.presets)
    also = f" and {presets} preset{'s' if presets != 1 else ''}" if presets else ""
    typer.echo(f"{count} resource{'s' if count != 1 else ''}{also} OK")
