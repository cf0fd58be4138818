"""`dstack ps`: the runs in state, with their status asked live from the agents."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.inspect.runs import JobView, RunView
    from dstack_plan.project import Project

_STATUS_STYLE = {
    "running": "green",
    "done": "grey50",
    "failed": "red",
    "terminated": "grey50",
    "aborted": "red",
    "terminating": "yellow",
}
_WRAPPING = ("HOSTS", "PORTS", "NOTE")
"""The columns of `dstack ps` whose cells wrap between words on a narrow terminal."""


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
    watch: bool = typer.Option(
        False, "-w", "--watch", help="Show the table again every --interval until Ctrl-C."
    ),
    interval: str = typer.Option("2s", "--interval", help="Time between refreshes (2s, 1m)."),
    run: str = typer.Option(
        None,
        "--run",
        help="Only this run (name or address), finished or not, with every job and its "
        "attempts: each submission watch's retry made (dstack logs RUN --attempt N).",
    ),
) -> None:
    """List runs: active ones and those that finished in the last hour (all with -a).

    --json prints a list of {address, kind, name, status, fleet, hosts, gpus, price_per_hour,
    created_at, finished_at, error, failure, jobs: [{id, status, exit_code, termination_reason,
    termination_message, replica, node, host, gpus, ports: [{container_port, host_port,
    host_ip}], started_at, finished_at}], notes: [str], url, scaling: {desired, wanted, rps,
    scaled_at, held_by, held_until}, attempts: [{attempt, status, reason, hosts, jobs: [...],
    ended_at}]}, newest first (url and scaling for services a `dstack watch --proxy-port`
    serves; attempts: the run's submissions, oldest first, the last its current jobs: watch's
    retry keeps the ten before it, with their logs). PORTS shows where
    each job listens on its host: `127.0.0.1:49153 -> 8799` for a container's port Docker
    published, `8799` for a port on the host network. NOTE (`notes`) says what watch is doing
    about a run: retrying at a time, waiting for capacity, its next cron run, a service's
    scaling, a rolling update in progress.
    -w shows the table again every --interval (in place on a terminal) until Ctrl-C.
    --run RUN shows that run alone, and below it its attempts (ATTEMPT, STATUS, REASON, HOSTS,
    ENDED) when watch's retry submitted it more than once.
    Nothing is written to state.
    """
    from dstack_plan.cli.output import print_json, print_table
    from dstack_plan.inspect.runs import find_run, list_runs

    project = common.make_project(directory, files, state)
    only = {r.address for r in project.load()} if files else None
    if run is not None:
        address = find_run(project.backend.read().state, run).address
        only = {address} if only is None or address in only else set()
        all_runs = True  # asked for by name: shown however long ago it ended
    if watch:
        seconds = _seconds(interval)
        try:
            common.run_with(project, lambda p: _live(p, seconds, all_runs, only, as_json))
        except KeyboardInterrupt:  # how a user leaves a live view: not an error
            return
        return
    views = common.run_with(project, lambda p: list_runs(p, all_runs=all_runs, addresses=only))
    if as_json:
        print_json([v.model_dump(mode="json") for v in views])
        return
    print_table(_render(views, project.clock.now(), all_runs, detail=run is not None))


def _seconds(interval: str) -> float:
    from dstack_plan.config.units import parse_duration
    from dstack_plan.errors import DstackPlanError

    try:
        seconds = float(parse_duration(interval))
    except ValueError:
        try:
            seconds = float(interval.removesuffix("s"))
        except ValueError as e:
            raise DstackPlanError(f"--interval {interval!r}: {e}") from None
    if seconds <= 0:
        raise DstackPlanError("--interval must be more than 0s")
    return seconds


async def _live(
    project: Project, interval: float, all_runs: bool, only: set[str] | None, as_json: bool
) -> None:
    """Render the runs every `interval` seconds until cancelled (Ctrl-C): in place on a
    terminal, one after the other otherwise (a pipe, a log)."""
    import json

    from rich.live import Live

    from dstack_plan.cli.output import whole_rows
    from dstack_plan.inspect.runs import list_runs

    out = console()

    async def frame() -> Any:
        views = await list_runs(project, all_runs=all_runs, addresses=only)
        if as_json:
            return json.dumps([v.model_dump(mode="json") for v in views])
        return whole_rows(_render(views, project.clock.now(), all_runs))

    if as_json or not out.is_terminal:
        while True:
            shown = await frame()
            if as_json:
                print(shown, flush=True)
            else:
                out.print(shown)
                out.print()
                out.file.flush()
            await project.clock.sleep(interval)
    with Live(console=out, auto_refresh=False) as live:
        while True:
            live.update(await frame(), refresh=True)
            await project.clock.sleep(interval)


def console() -> Any:
    from dstack_plan.cli.output import console as make

    return make()


def _render(views: list[RunView], now: float, all_runs: bool = False, detail: bool = False) -> Any:
    """The runs table with its footnotes, as one rich renderable; with `detail` (one run),
    every job's row and the run's attempts."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from dstack_plan.web.wording import format_age, run_gpus

    if not views:
        # the hint would only repeat what -a just did
        return Text("No runs." if all_runs else "No runs. (dstack ps -a shows finished ones too.)")
    table = Table(box=None, pad_edge=False, header_style="bold")
    noted = any(view.notes for view in views)  # the NOTE column only when it says something
    columns = ["NAME", "STATUS", "FLEET", "HOSTS", "PORTS", "GPU", "PRICE", "AGE"]
    for column in [*columns, "NOTE"] if noted else columns:
        # names and statuses stay whole (a folded `replica=0 job=1` reads as two rows); host
        # lists, ports and notes wrap between words, never in an address (output.whole_rows)
        table.add_column(column, no_wrap=column not in _WRAPPING)
    for view in views:
        status = _styled(view.status) + ("[yellow]*[/]" if view.error else "")
        table.add_row(
            view.address,
            status,
            view.fleet,
            ", ".join(view.hosts) or "-",
            _ports(view.jobs[0]) if len(view.jobs) == 1 else "",
            run_gpus(view),
            f"${view.price_per_hour:.2f}/h",
            format_age(now - view.created_at.timestamp()),
            *([escape("; ".join(view.notes))] if noted else []),
        )
        if len(view.jobs) > 1 or (detail and view.jobs):
            for job in view.jobs:
                table.add_row(*_job_row(job, now)[: len(table.columns)])
    parts: list[Any] = [table]
    for view in views:
        # a long reason would wreck the table's layout, so it goes below it
        if view.error:
            parts.append(
                f"[yellow]* {view.address}: status as of the last apply: {escape(view.error)}[/]"
            )
        if view.failure:
            parts.append(f"[red]! {view.address} failed: {escape(view.failure)}[/]")
    if detail:
        parts += [_attempts(view) for view in views if len(view.attempts) > 1]
    return Group(*parts)


def _attempts(view: RunView) -> Any:
    """The run's submissions, oldest first: `dstack logs RUN --attempt N` reads each."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ATTEMPT", "STATUS", "REASON", "HOSTS", "ENDED"):
        table.add_column(column, no_wrap=column in ("ATTEMPT", "STATUS", "ENDED"))
    latest = view.attempts[-1].attempt
    for attempt in view.attempts:
        at = attempt.ended_at
        ended = at.astimezone().strftime("%Y-%m-%d %H:%M:%S") if at is not None else "-"
        table.add_row(
            f"{attempt.attempt}" + (" (latest)" if attempt.attempt == latest else ""),
            _styled(attempt.status),
            escape(attempt.reason or "-"),
            ", ".join(attempt.hosts) or "-",
            ended,
        )
    return Group("", f"Attempts of {escape(view.address)}:", table)


def _job_row(job: JobView, now: float) -> list[str]:
    from dstack_plan.web.wording import format_age, job_gpus, job_status_text

    age = format_age(now - job.started_at.timestamp()) if job.started_at else ""
    gpus = job_gpus(job)
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
        "",
    ]


def _ports(job: JobView) -> str:
    """`127.0.0.1:49153 -> 8799`, comma-separated; `-` for a job that listens on none."""
    return ", ".join(str(p) for p in job.ports) or "-"


def _styled(status: str) -> str:
    style = _STATUS_STYLE.get(status.split(" ")[0])
    if status.startswith("exited"):
        style = "red"
    return f"[{style}]{status}[/]" if style else status
