"""`dstack agent ...`: the local agent, the one `dstack` starts on this machine for the
`local` fleet; alone, `dstack agent` is `dstack agent status`.

The same commands as `python -m dstack_plan.agent status|stop`, through the agent package's
own daemon functions, spelled so that they work wherever `dstack` does (the module needs the
project's virtualenv).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.agent.datadir import DataDir

app = typer.Typer(
    name="agent",
    help="The local agent (status, stop); alone, as `dstack agent status`.",
    add_completion=False,
    rich_markup_mode=None,
)

NOT_RUNNING = 3
"""Exit code of `status` when no agent runs (as `python -m dstack_plan.agent status`)."""

DataDirOpt = typer.Option(
    None,
    "--data-dir",
    help="The agent's data dir (default: the local agent's, $DSTACK_PLAN_AGENT_DIR or "
    "~/.local/state/dstack-plan/agent).",
    show_default=False,
)


def _data_dir(given: Path | None) -> DataDir:
    from dstack_plan.agent.datadir import DataDir, default_agent_dir

    return DataDir(given or default_agent_dir())


@app.callback(invoke_without_command=True)
def bare(
    ctx: typer.Context, data_dir: Path | None = DataDirOpt, as_json: bool = common.JsonOpt
) -> None:
    """`dstack agent [--json]` alone is `dstack agent status`."""
    common.run_bare_group(ctx, lambda: status(data_dir, as_json))


@app.command("status")
def status(data_dir: Path | None = DataDirOpt, as_json: bool = common.JsonOpt) -> None:
    """Whether the local agent runs: its pid, data dir, URL, version, agent id and start time
    (from the data dir's agent.json). Exit 0 when it runs, 3 when it does not.

    --json prints {running, data_dir} and, while it runs, its connection info: {pid, host,
    port, url, token_file, version, agent_id, started_at}.
    """
    from dstack_plan.agent.daemon import status as agent_status
    from dstack_plan.cli.output import print_json, print_lines

    info = agent_status(_data_dir(data_dir))
    if as_json:
        print_json(info)
    else:
        print_lines(_status_lines(info))
    if not info["running"]:
        raise typer.Exit(NOT_RUNNING)


def _status_lines(info: dict[str, Any]) -> list[str]:
    root = info["data_dir"]
    if not info["running"]:
        return [f"The local agent is not running (data dir {root})."]
    if "pid" not in info:  # it holds the data dir but has not written agent.json yet
        return [f"The local agent is running (data dir {root}); it is still starting."]
    started = info.get("started_at")
    when = (
        datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        if isinstance(started, (int, float))
        else "-"
    )
    fields = [
        ("pid", info["pid"]),
        ("data dir", root),
        ("url", info.get("url", "-")),
        ("version", info.get("version", "-")),
        ("agent id", info.get("agent_id", "-")),
        ("started", when),
    ]
    return ["The local agent is running."] + [f"  {k + ':':<10} {v}" for k, v in fields]


@app.command("stop")
def stop(
    data_dir: Path | None = DataDirOpt,
    timeout: float = typer.Option(
        15.0, "--timeout", help="Seconds to wait after SIGTERM before SIGKILL."
    ),
    pid: int | None = typer.Option(
        None,
        "--pid",
        help="Stop it only if the running agent is this process (not one started since).",
    ),
) -> None:
    """Stop the local agent: SIGTERM (and SIGCONT, so that a stopped one gets it too), SIGKILL
    after --timeout. Its containers keep running and are re-adopted by the next start; its
    process jobs end `executor_error`. The next command that needs the agent starts it again.
    """
    from dstack_plan.agent.daemon import DaemonError
    from dstack_plan.agent.daemon import stop as agent_stop
    from dstack_plan.agent.liveness import is_running, read_pid
    from dstack_plan.cli.output import print_lines
    from dstack_plan.errors import AgentError

    data = _data_dir(data_dir)
    running = read_pid(data) if is_running(data) else None
    try:
        stopped = agent_stop(data, timeout, pid)
    except (DaemonError, OSError) as e:
        raise AgentError("localhost", f"cannot stop the local agent: {e}") from None
    if stopped:
        print_lines([f"Stopped the local agent (pid {running}, data dir {data.root})."])
    elif running is not None and pid is not None:
        print_lines([f"The local agent is pid {running}, not {pid}: left running."])
    else:
        print_lines([f"The local agent is not running (data dir {data.root})."])
