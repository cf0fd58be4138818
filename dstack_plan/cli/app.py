"""The `dstack` command line: one typer app, one module per command.

Command modules import their heavy dependencies inside the command, so `dstack --help` stays fast.
A run of one command builds only that command: typer turns every registered function into a click
command before dispatching, and doing that for all of them costs `dstack plan` 15-20 ms of its
start-up.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

try:  # typer 0.26+ vendors click
    from typer._click.exceptions import UsageError
except ImportError:  # earlier versions depend on click itself
    from click.exceptions import UsageError  # type: ignore[no-redef,assignment,unused-ignore]

RUN_ARGS = "dstack_plan.run_args"
"""`ctx.meta` key of the arguments given after `--` (see `_RunArgsCommand`)."""


class _RunArgsCommand(TyperCommand):
    """A command whose arguments after `--` are the run's (`${{ run.args }}`), kept in
    `ctx.meta[RUN_ARGS]`; any other positional argument beyond its own is a usage error.

    Without the `--`, `dstack apply foo bar` would quietly read `foo` as the project
    directory and `bar` as a run argument: a guess, and often the wrong one.
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        run_args: list[str] = []
        if "--" in args:
            cut = args.index("--")
            args, run_args = args[:cut], args[cut + 1 :]
        ctx.meta[RUN_ARGS] = run_args
        rest = super().parse_args(ctx, args)
        if ctx.args:
            extra = " ".join(ctx.args)
            raise UsageError(
                f"unexpected argument {ctx.args[0]!r}: give one project directory; arguments "
                f"for the run go after `--` (dstack {ctx.info_name} DIR -- {extra})",
                ctx,
            )
        return rest


# name -> (module in dstack_plan.cli, function, extra settings); in the order `--help` lists them
_COMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "validate": ("validate_cmd", "validate", {}),
    "plan": ("plan_cmd", "plan", {}),
    "apply": (
        "apply_cmd",
        "apply",
        {"cls": _RunArgsCommand, "context_settings": {"allow_extra_args": True}},
    ),
    "destroy": ("apply_cmd", "destroy", {}),
    "delete": ("delete_cmd", "delete", {}),
    "schema": ("schema_cmd", "schema", {}),
    "init": ("init_cmd", "init", {}),
    "ps": ("ps_cmd", "ps", {}),
    "logs": ("logs_cmd", "logs", {}),
    "stop": ("stop_cmd", "stop", {}),
    "attach": ("attach_cmd", "attach", {}),
    "graph": ("graph_cmd", "graph", {}),
    "offer": ("offer_cmd", "offer", {}),
    "exec": (
        "exec_cmd",
        "exec_",
        {"cls": _RunArgsCommand, "context_settings": {"allow_extra_args": True}},
    ),
    "top": ("top_cmd", "top", {}),
    "events": ("events_cmd", "events", {}),
    "watch": ("watch_cmd", "watch", {}),
    "ui": ("ui_cmd", "ui", {}),
}
# name -> module whose `app` is a typer group of subcommands
_GROUPS: dict[str, str] = {
    "state": "state_cmd",
    "fleet": "fleet_cmd",
    "namespace": "namespace_cmd",
    "export": "export_cmd",
    "catalog": "catalog_cmd",
    "agent": "agent_cmd",
}
# the global options (see `_global`), split by whether they take a value
_GLOBAL_FLAGS = ("--debug", "--no-color")
_GLOBAL_VALUE_OPTIONS = ("--log-level", "--log-format")


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("dstack-plan")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from dstack_plan import __version__ as number
    sys.stdout.write(f"dstack-plan {number}\n")
    raise typer.Exit()


def _global(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version and exit.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of internal errors."),
    no_color: bool = typer.Option(False, "--no-color", help="Disable colours."),
    log_level: str = typer.Option(
        None, "--log-level", help="Log to stderr from this level: debug, info, warning, error."
    ),
    log_format: str = typer.Option(
        None,
        "--log-format",
        help="Log lines as text (default) or json (one object a line: ts, level, event, "
        "address, job_id, host, resource_type, span_id, message, logger; level info unless "
        "--log-level says otherwise).",
    ),
) -> None:
    if debug:
        os.environ["DSTACK_PLAN_DEBUG"] = "1"
    if no_color:
        os.environ["NO_COLOR"] = "1"
    if log_level or log_format:
        # JSON lines are for collectors, which want what happened (info), not only problems.
        default = "info" if log_format == "json" else "warning"
        _configure_logging(log_level or default, log_format or "text")


def _configure_logging(level: str, log_format: str) -> None:
    from dstack_plan.agent.logformat import configure

    try:
        configure(level.lower(), log_format)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


@contextmanager
def _usage_errors_exit_1() -> Iterator[None]:
    try:
        yield
    except UsageError as e:
        e.exit_code = 1
        raise


class _Group(TyperGroup):
    """The top-level group: bad usage (an unknown option or command, a missing or invalid
    argument) exits 1, like every other error.

    click exits 2 there, but 2 is what `dstack plan --detailed-exitcode` answers when changes
    are present: a CI gate must not read a typo as a pending change. Terraform exits 1 too.
    """

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _usage_errors_exit_1():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors_exit_1():
            return super().invoke(ctx)


def build_app(only: str | None = None) -> typer.Typer:
    """The `dstack` typer app with every command, or with only the command named `only`."""
    cli = typer.Typer(
        name="dstack",
        cls=_Group,
        help="Terraform-style plan/apply for AI compute, speaking dstack's YAML.",
        no_args_is_help=True,
        add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish)
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    cli.callback()(_global)
    for name, (module, function, settings) in _COMMANDS.items():
        if only in (None, name):
            cli.command(name, **settings)(getattr(_command_module(module), function))
    for name, module in _GROUPS.items():
        if only in (None, name):
            cli.add_typer(_command_module(module).app, name=name)
    return cli


def invoked_command(args: Sequence[str]) -> str | None:
    """The command these arguments run, when only global options come before it; else None.

    None (anything else first, `--help` say, or an unknown command) means the whole app is
    needed: to list the commands, or to say which ones exist.
    """
    remaining = iter(args)
    for arg in remaining:
        if arg in _GLOBAL_VALUE_OPTIONS:
            next(remaining, None)
        elif arg in _GLOBAL_FLAGS or arg.startswith(tuple(f"{o}=" for o in _GLOBAL_VALUE_OPTIONS)):
            continue
        else:
            return arg if arg in _COMMANDS or arg in _GROUPS else None
    return None


def _command_module(name: str) -> Any:
    return importlib.import_module(f"dstack_plan.cli.{name}")


def __getattr__(name: str) -> Any:
    # `app`, the whole CLI, is built on first use: the console script builds only what it runs
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Run the command `sys.argv` names; errors are printed, never shown as tracebacks."""
    from dstack_plan.errors import DstackPlanError

    try:
        build_app(only=invoked_command(sys.argv[1:]))()
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
