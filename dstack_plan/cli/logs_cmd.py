"""`dstack logs`: a run's job output, raw bytes on stdout (or JSON lines with `--json`)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dstack_plan.cli import common


def logs(
    run: str = typer.Argument(..., help="Run name (hello) or address (task.hello)."),
    directory: Path = common.DirArg,
    state: str = common.StateOpt,
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep streaming until it ends."),
    since: str = typer.Option(
        None,
        "--since",
        help="10m or an RFC 3339 time: only output written from then on (the agent dates "
        "what it stores, to about a second; with --json, events too).",
    ),
    replica: int = typer.Option(0, "--replica", min=0, help="Replica number (services)."),
    job: int = typer.Option(0, "--job", min=0, help="Job (node) number within the replica."),
    attempt: int = typer.Option(
        None,
        "--attempt",
        min=1,
        help="Which submission of a run watch's retry resubmitted: 1 is the first (default: "
        "the latest). `dstack ps --run RUN` lists them.",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="One JSON object a line (ts, level, event, address, job_id, host, resource_type, "
        "span_id, message, logger): the job's output lines merged in time order with the "
        "run's events, as `dstack watch --log-format json` writes them.",
    ),
) -> None:
    """Print the log of one job of a run (replica 0, job 0 of its latest attempt unless told
    otherwise)."""
    from dstack_plan.inspect.logs import parse_since, write_logs

    project = common.make_project(directory, [], state)
    cutoff = parse_since(since, project.clock.now()) if since else None
    sys.stdout.flush()
    if as_json:
        from dstack_plan.inspect.json_logs import write_json_logs

        common.run_with(
            project,
            lambda p: write_json_logs(
                p,
                run,
                sys.stdout,
                replica=replica,
                job=job,
                follow=follow,
                since=cutoff,
                attempt=attempt,
            ),
        )
        return
    common.run_with(
        project,
        lambda p: write_logs(
            p,
            run,
            sys.stdout.buffer,
            replica=replica,
            job=job,
            follow=follow,
            since=cutoff,
            attempt=attempt,
        ),
    )
