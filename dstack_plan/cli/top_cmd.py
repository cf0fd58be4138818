"""`dstack top`: a live table of the hosts, fed by their agents."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.inspect.top import TopView
    from dstack_plan.project import Project


def top(
    directory: Path = common.DirArg,
    state: str = common.StateOpt,
    interval: float = typer.Option(
        2.0, "--interval", min=0.1, help="Seconds between refreshes on a terminal."
    ),
    as_json: bool = common.JsonOpt,
) -> None:
    """Every host's GPUs (used/total), memory and CPU use, and tasks, asked of its agent.

    The hosts of every SSH fleet in state, and this machine when state has runs on it or
    there is no SSH fleet; then those of the fleets other projects export to this one. On a
    terminal the table is refreshed in place every `--interval` seconds until Ctrl-C;
    piped, or with --json, one snapshot is printed. --json gives
    {taken_at, hosts: [{fleet, host, agent, error, gpus_used, gpus_total, gpu_names,
    memory_percent, cpu_percent, tasks, runs}]}. A host that does not answer is shown with
    why; the others are unaffected. Nothing is written to state.
    """
    from dstack_plan.cli.output import print_json, print_lines

    project = common.make_project(directory, [], state)
    if as_json or not sys.stdout.isatty():
        view = common.run_with(project, _snapshot)
        if as_json:
            print_json(view.model_dump(mode="json"))
        else:
            print_lines(_plain_table(view))
        return
    try:
        common.run_with(project, lambda p: _live(p, interval))
    except KeyboardInterrupt:  # how a user leaves a live view: not an error
        return


async def _snapshot(project: Project) -> TopView:
    from dstack_plan.inspect.top import TopSampler

    sampler = TopSampler(project.machines, project.clock)
    return await sampler.snapshot(project.backend.read().state)


async def _live(project: Project, interval: float) -> None:
    from rich.live import Live

    from dstack_plan.cli.output import console, whole_rows
    from dstack_plan.inspect.top import TopSampler

    sampler = TopSampler(project.machines, project.clock)
    with Live(console=console(), auto_refresh=False) as live:
        while True:
            # state is read again each time: hosts an apply adds meanwhile show up
            view = await sampler.snapshot(project.backend.read().state)
            live.update(whole_rows(_rich_table(view, interval)), refresh=True)
            await project.clock.sleep(interval)


def _plain_table(view: TopView) -> list[str]:
    from dstack_plan.inspect.top import HEADERS, error_lines, table_rows

    rows = [HEADERS, *table_rows(view)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return [line.rstrip() for line in lines] + error_lines(view)


def _rich_table(view: TopView, interval: float) -> Any:
    from datetime import datetime

    from rich.table import Table

    from dstack_plan.inspect.top import HEADERS, error_lines, table_rows

    when = datetime.fromtimestamp(view.taken_at).strftime("%H:%M:%S")
    notes = [*error_lines(view), f"{when}, every {interval:g}s; Ctrl-C to quit"]
    table = Table(box=None, header_style="bold", caption="\n".join(notes), caption_justify="left")
    for header in HEADERS:
        table.add_column(header, no_wrap=True)
    for host, cells in zip(view.hosts, table_rows(view), strict=True):
        table.add_row(*cells, style="red" if host.error else None)
    return table
