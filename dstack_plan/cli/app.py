"""The `dstack` console script: one typer app, one module per command.

Command modules import their heavy dependencies inside the command, so `dstack --help` stays fast.
"""

from __future__ import annotations

import os
import sys

import typer

from dstack_plan.cli import (
    apply_cmd,
    graph_cmd,
    init_cmd,
    logs_cmd,
    plan_cmd,
    ps_cmd,
    schema_cmd,
    state_cmd,
    stop_cmd,
    validate_cmd,
)

app = typer.Typer(
    name="dstack",
    help="Terraform-style plan/apply for AI compute, speaking dstack's YAML.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _global(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of internal errors."),
    no_color: bool = typer.Option(False, "--no-color", help="Disable colours."),
    log_level: str = typer.Option(
        None, "--log-level", help="Log to stderr from this level: debug, info, warning, error."
    ),
    log_format: str = typer.Option(
        None, "--log-format", help="Log lines as text (default) or json (one object a line)."
    ),
) -> None:
    if debug:
        os.environ["DSTACK_PLAN_DEBUG"] = "1"
    if no_color:
        os.environ["NO_COLOR"] = "1"
    if log_level or log_format:
        _configure_logging(log_level or "warning", log_format or "text")


def _configure_logging(level: str, log_format: str) -> None:
    from dstack_plan.agent.logformat import FORMATS, configure

    levels = ("debug", "info", "warning", "error")
    if level.lower() not in levels or log_format not in FORMATS:
        raise typer.BadParameter(
            f"--log-level is one of {', '.join(levels)}; --log-format one of {', '.join(FORMATS)}"
        )
    configure(level.lower(), log_format)


app.command("validate")(validate_cmd.validate)
app.command("plan")(plan_cmd.plan)
app.command("apply", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(
    apply_cmd.apply
)
app.command("destroy")(apply_cmd.destroy)
app.command("schema")(schema_cmd.schema)
app.command("init")(init_cmd.init)
app.command("ps")(ps_cmd.ps)
app.command("logs")(logs_cmd.logs)
app.command("stop")(stop_cmd.stop)
app.command("graph")(graph_cmd.graph)
app.add_typer(state_cmd.app, name="state")


def main() -> None:
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.gcpause import spare_exit_collection

    spare_exit_collection()
    try:
        app()
    except DstackPlanError as e:
        from dstack_plan.cli.output import print_error

        print_error(e)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(130)
    except Exception:  # noqa: BLE001 - the last line of defence: a bug, said as such
        from dstack_plan.cli.output import print_bug

        print_bug()
        sys.exit(1)


if __name__ == "__main__":
    main()
