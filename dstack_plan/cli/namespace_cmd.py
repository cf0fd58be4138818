"""`dstack namespace ...`: namespaces and their quotas, kept in `.dstack/quotas.yml`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.config.quotas import QuotasEdit

app = typer.Typer(
    name="namespace",
    help="Namespaces and their quotas (create, set, limit, delete, list).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

LIMITS_HELP = (
    "KEY=VALUE, repeatable: gpus (or gpu), gpu_hours_per_day, cost_per_hour; "
    "VALUE a number >= 0 (0 allows none) or `none` to remove the limit."
)
DirOpt = typer.Option(Path("."), "--dir", help="Project directory.")
NameArg = typer.Argument(..., help="The namespace (a name like a run's: dev, team-a).")


def _save(directory: Path, edit: QuotasEdit, said: str) -> None:
    from dstack_plan.cli.output import print_lines
    from dstack_plan.config.quotas import QUOTAS_FILE, save_quotas

    common.require_directory(directory)
    save_quotas(directory, edit)
    print_lines([f"{said} ({QUOTAS_FILE})"])


@app.command("create")
def create(
    name: str = NameArg,
    quota: list[str] = typer.Option([], "--quota", help=LIMITS_HELP),
    directory: Path = DirOpt,
) -> None:
    """Create a namespace, with its limits.

    `dstack namespace create dev --quota gpus=20 --quota gpu_hours_per_day=100`. Runs join
    it with `namespace: dev`. A plan whose runs would exceed a limit fails, naming the
    namespace, the limit and the amount asked.
    """
    from dstack_plan.config.quotas_edit import create_namespace, parse_limits

    edit = create_namespace(name, parse_limits(quota, "--quota"))
    _save(directory, edit, f"Created namespace {name}")


@app.command("set")
def set_(
    name: str = NameArg,
    quota: list[str] = typer.Option([], "--quota", help=LIMITS_HELP),
    directory: Path = DirOpt,
) -> None:
    """Change the limits of a namespace.

    `dstack namespace set dev --quota gpus=30 --quota cost_per_hour=none`.
    """
    from dstack_plan.config.quotas_edit import parse_limits, set_limits
    from dstack_plan.errors import DstackPlanError

    if not quota:
        raise DstackPlanError("give at least one --quota KEY=VALUE to change")
    _save(directory, set_limits(name, parse_limits(quota, "--quota")), f"Updated namespace {name}")


@app.command("limit")
def limit(
    name: str = NameArg,
    user: str = typer.Option(None, "--user", help="The user whose own limits to set."),
    per_user: bool = typer.Option(
        False, "--per-user", help="Set the limits of every user without limits of their own."
    ),
    limits: list[str] = typer.Option([], "--limit", help=LIMITS_HELP),
    clear: bool = typer.Option(
        False, "--clear", help="Remove the user's own limits (or, with --per-user, per_user)."
    ),
    directory: Path = DirOpt,
) -> None:
    """Limits per user in a namespace.

    `dstack namespace limit dev --user alice --limit gpu_hours_per_day=5` gives alice limits
    of her own, which replace the namespace's per-user limits for her (`--per-user` sets
    those). Users are who applied the run: `DSTACK_PLAN_USER`, else the login name.
    """
    from dstack_plan.config.quotas_edit import clear_limits, parse_limits, set_limits
    from dstack_plan.errors import DstackPlanError

    if (user is None) == (not per_user):
        raise DstackPlanError("give one of --user NAME or --per-user")
    whose = f"user {user}" if user is not None else "every user"
    if clear:
        if limits:
            raise DstackPlanError("--clear takes no --limit")
        _save(directory, clear_limits(name, user), f"Cleared the limits of {whose} in {name}")
        return
    if not limits:
        raise DstackPlanError("give at least one --limit KEY=VALUE (or --clear)")
    edit = set_limits(name, parse_limits(limits, "--limit"), user=user, per_user=per_user)
    _save(directory, edit, f"Updated the limits of {whose} in {name}")


@app.command("delete")
def delete(name: str = NameArg, directory: Path = DirOpt) -> None:
    """Remove a namespace's quota entry. Its runs keep running, with no limits."""
    from dstack_plan.config.quotas_edit import delete_namespace

    _save(directory, delete_namespace(name), f"Deleted namespace {name}")


@app.command("list")
def list_(
    directory: Path = DirOpt,
    state: str = common.StateOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """Limits beside usage, per namespace and user.

    Each namespace's limits beside what it holds and used today, and its users'.
    Cells read `used / limit`; a number alone has no limit; `-` is no limit. Usage comes
    from the state the last apply or watch wrote (GPU-hours count until now; the day is
    UTC). --json gives {namespaces: [{name, quota, limits, per_user, usage, users: [{name,
    limits, own_limits, usage}]}]}; limits {gpus, gpu_hours_per_day,
    cost_per_hour} (null: no limit); usage {gpus, gpu_hours_today, cost_per_hour}.
    """
    import time

    from dstack_plan.cli.output import print_json, print_lines
    from dstack_plan.config.quotas import load_quotas
    from dstack_plan.inspect.namespaces import HEADERS, namespaces_view, table_rows
    from dstack_plan.runs.usage import namespace_usage

    project = common.make_project(directory, [], state)
    quotas = load_quotas(directory)
    usage = namespace_usage(project.backend.read().state, time.time())
    view = namespaces_view(quotas, usage)
    if as_json:
        print_json(view.model_dump(mode="json"))
        return
    if not view.namespaces:
        print_lines(["No namespaces: create one with `dstack namespace create NAME --quota ...`"])
        return
    rows = [HEADERS, *table_rows(view)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    print_lines([line.rstrip() for line in lines])
