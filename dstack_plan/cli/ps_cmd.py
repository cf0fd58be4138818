"""`dstack ps`: the runs in state, with their status asked live from the agents."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.inspect.runs import JobView, RunView

_STATUS_STYLE = {
    "running": "green",
    "done": "grey50",
    "failed": "red",
    "terminated": "grey50",
    "aborted": "red",
    "terminating": "yellow",
}


def ps(
    directory: Path = common.DirArg,
    files: list[str] = typer.Option(
        [], "-f", "--file", help="Only runs declared in FILE (repeatable)."
    ),
    state: str = common.StateOpt,
    all_runs: bool = typer.Option(
        False, "-a", "--all", help="Also runs that finished more than an hour ago."
    ),
    as_json: bool = common.JsonOpt,
) -> None:
    """List runs: active ones and those that finished in the last hour (all with -a).

    --json prints a list of {address, kind, name, status, fleet, hosts, gpus, price_per_hour,
    created_at, finished_at, error, failure, jobs: [{id, status, exit_code, termination_reason,
    termination_message, replica, node, host, gpus, ports: [{container_port, host_port,
    host_ip}], started_at, finished_at}]}, newest first. PORTS shows where each job listens
    on its host: `127.0.0.1:49153 -> 8799` for a container's port Docker published, `8799`
    for a port on the host network.
    Nothing is written to state.
    """
    from dstack_plan.cli.output import print_json
    from dstack_plan.inspect.runs import list_runs

    project = common.make_project(directory, files, state)
    only = {r.address for r in project.load()} if files else None
    views = common.run_with(project, lambda p: list_runs(p, all_runs=all_runs, addresses=only))
    if as_json:
        print_json([v.model_dump(mode="json") for v in views])
        return
    _print_table(views, project.clock.now(), all_runs)


def _print_table(views: list[RunView], now: float, all_runs: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table

    from dstack_plan.cli.output import console

    out = console()
    if not views:
        # the hint would only repeat what -a just did
        out.print("No runs." if all_runs else "No runs. (dstack ps -a shows finished ones too.)")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("NAME", "STATUS", "FLEET", "HOSTS", "PORTS", "GPU", "PRICE", "AGE"):
        table.add_column(column, overflow="fold")
    for view in views:
        status = _styled(view.status) + ("[yellow]*[/]" if view.error else "")
        table.add_row(
            view.address,
            status,
            view.fleet,
            ",".join(view.hosts) or "-",
            _ports(view.jobs[0]) if len(view.jobs) == 1 else "",
            view.gpus or "-",
            f"${view.price_per_hour:.2f}/h",
            format_age(now - view.created_at.timestamp()),
        )
        if len(view.jobs) > 1:
            for job in view.jobs:
                table.add_row(*_job_row(job, now))
    out.print(table)
    for view in views:
        # a long reason would wreck the table's layout, so it goes below it
        if view.error:
            out.print(
                f"[yellow]* {view.address}: status as of the last apply: {escape(view.error)}[/]"
            )
        if view.failure:
            out.print(f"[red]! {view.address} failed: {escape(view.failure)}[/]")


def _job_row(job: JobView, now: float) -> list[str]:
    age = format_age(now - job.started_at.timestamp()) if job.started_at else ""
    gpus = ",".join(str(g) for g in job.gpus) if job.gpus else ""
    name = f"  replica={job.replica} job={job.node}"
    return [
        f"[dim]{name}[/]",
        _styled(job_status_text(job)),
        "",
        job.host,
        _ports(job),
        gpus,
        "",
        age,
    ]


def _ports(job: JobView) -> str:
    """`127.0.0.1:49153 -> 8799`, comma-separated; `-` for a job that listens on none."""
    return ", ".join(str(p) for p in job.ports) or "-"


def job_status_text(job: JobView) -> str:
    """dstack's job wording: `exited (N)` for a failure with an exit code, `stopped`..."""
    if job.status == "failed" and job.exit_code is not None:
        return f"exited ({job.exit_code})"
    if job.status == "terminated":
        return "stopped"
    return job.status


def _styled(status: str) -> str:
    style = _STATUS_STYLE.get(status.split(" ")[0])
    if status.startswith("exited"):
        style = "red"
    return f"[{style}]{status}[/]" if style else status


def format_age(seconds: float) -> str:
    """`now`, `45s`, `12m`, `3h`, `5d` (the largest whole unit)."""
    if seconds < 1:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
