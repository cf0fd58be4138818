"""`dstack exec`: run a command on every host of the project's SSH fleets."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.state.model import State


def exec_(
    ctx: typer.Context,
    directory: Path = common.DirArg,
    files: list[str] = common.FilesOpt,
    state: str = common.StateOpt,
    fleet: str = typer.Option(None, "--fleet", help="Only this fleet's hosts (its NAME)."),
    hosts: str = typer.Option(
        None, "--hosts", help="Only these hosts, comma-separated (HOST or HOST:PORT)."
    ),
    parallelism: int = typer.Option(
        32, "--parallelism", min=1, help="Hosts to run on at the same time."
    ),
    as_json: bool = common.JsonOpt,
) -> None:
    """Run COMMAND (after `--`) on every host of the SSH fleets, concurrently.

    Each output line is printed prefixed with its host's name, then a summary; the exit
    code is 1 when any host failed (unreachable, or the command exited non-zero). A host it
    ran on counts as activity of the dev environments there (their inactivity_duration). The
    arguments reach the host exactly as given (quoted, never re-split by a shell).
    Host keys are checked against ~/.ssh/known_hosts and the keys state pinned when the
    fleet was applied; a host neither knows is trusted on first use for this run only.

    Example: dstack exec --fleet gpus -- nvidia-smi -L
    """
    import asyncio

    from dstack_plan.cli.app import RUN_ARGS
    from dstack_plan.config.loader import load_project
    from dstack_plan.inspect.fanout import pinned_keys, run_on_hosts, select_hosts
    from dstack_plan.providers.ssh.hostkeys import HostKeyPolicy, MemoryHostKeyStore
    from dstack_plan.state.select import open_backend

    common.require_directory(directory)
    command: list[str] = ctx.meta.get(RUN_ARGS, [])
    stdin = sys.stdin.read() if "-" in files else None
    names = [n.strip() for n in hosts.split(",") if n.strip()] if hosts else []
    selected = select_hosts(load_project(directory, files, stdin), fleet, names)
    width = max(len(h.name) for h in selected)
    stored = open_backend(directory, state).read().state
    pins = pinned_keys(stored)
    policy = HostKeyPolicy(MemoryHostKeyStore(pins))

    def show(host: str, stream: str, line: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(f"{host:<{width}} | {line}\n")
        out.flush()  # lines from a long command appear as they come

    report = asyncio.run(
        run_on_hosts(
            selected,
            command,
            on_line=None if as_json else show,
            parallelism=parallelism,
            policy=policy,
        )
    )
    if as_json:
        from dstack_plan.cli.output import print_json

        print_json(
            {
                "command": list(report.command),
                "hosts": [h.model_dump() for h in report.hosts],
                "ok": not report.failed,
                "summary": report.summary(),
            }
        )
    else:
        for failed in report.failed:
            if failed.exit_code is None:  # a non-zero exit speaks for itself in its output
                sys.stderr.write(f"{failed.host:<{width}} | error: {failed.error}\n")
        sys.stdout.write(report.summary() + "\n")
    # a command run on a host is activity of the dev environments there (inactivity_duration)
    _record_activity(
        directory,
        state,
        stored,
        {(h.fleet, h.host) for h in report.hosts if h.exit_code is not None},
    )
    if report.failed:
        raise typer.Exit(1)


def _record_activity(
    directory: Path, state_opt: str, stored: State, hosts: set[tuple[str, str]]
) -> None:
    """Touch the active dev-environment jobs on `hosts` (nothing to connect to when none)."""
    from dstack_plan.inspect.activity import dev_jobs, touch_jobs

    jobs = dev_jobs(stored, hosts)
    if jobs:
        project = common.make_project(directory, [], state_opt)
        common.run_with(project, lambda p: touch_jobs(p, jobs, stored))
