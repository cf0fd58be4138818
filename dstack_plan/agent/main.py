"""Command line of the agent: `serve`, `start`, `stop`, `status` (argparse; stdlib only)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from dstack_plan.agent import daemon
from dstack_plan.agent.datadir import AGENT_DIR_ENV, DataDir, default_agent_dir
from dstack_plan.agent.logformat import FORMATS, LEVELS, configure
from dstack_plan.agent.protocol import AGENT_VERSION, DEFAULT_LOG_MAX_BYTES

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def byte_size(text: str) -> int:
    """`1048576`, `512k`, `64M`, `1G` -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1048576, 512K, 64M)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dstack-plan-agent", description="dstack-plan host agent"
    )
    parser.add_argument("--version", action="version", version=AGENT_VERSION)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="where the token, job records and logs live (default: the local agent's, "
            f"${AGENT_DIR_ENV} or ~/.local/state/dstack-plan/agent)",
        )
        return sub

    for name, help_text in (("serve", "run in the foreground"), ("start", "run detached")):
        sub = command(name, help_text)
        sub.add_argument(
            "--port",
            type=int,
            default=0,
            help="port on 127.0.0.1 (0: pick a free one; see agent.json)",
        )
        sub.add_argument(
            "--log-max-bytes",
            type=byte_size,
            default=DEFAULT_LOG_MAX_BYTES,
            help="per-job log cap; older output is rotated away (default 64M)",
        )
        sub.add_argument("--log-level", default="info", choices=LEVELS)
        sub.add_argument(
            "--log-format", default="text", choices=FORMATS, help="the agent's own log lines"
        )
        if name == "start":
            sub.add_argument(
                "--wait", type=float, default=20.0, help="seconds to wait for the agent to answer"
            )
    stop = command("stop", "stop the detached agent (jobs in containers keep running)")
    stop.add_argument("--timeout", type=float, default=15.0)
    stop.add_argument(
        "--pid",
        type=int,
        default=None,
        help="stop it only if the running agent is this process (not one started since)",
    )
    command("status", "print whether an agent runs and how to reach it")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (status: 0 running, 3 not running)."""
    args = _parser().parse_args(argv)
    # resolved here, not as the argparse default, so --help shows no machine-specific path
    data = DataDir(args.data_dir or default_agent_dir())
    configure(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"))
    try:
        if args.command == "serve":
            return daemon.serve(data, args.port, args.log_max_bytes)
        if args.command == "start":
            print(
                daemon.dumps(
                    daemon.start(
                        data,
                        args.port,
                        args.log_max_bytes,
                        args.wait,
                        args.log_level,
                        args.log_format,
                    )
                )
            )
            return 0
        if args.command == "stop":
            stopped = daemon.stop(data, args.timeout, args.pid)
            print("stopped" if stopped else f"no agent runs on {data.root}")
            return 0
        info = daemon.status(data)
        print(daemon.dumps(info))
        return 0 if info["running"] else 3
    except daemon.DaemonError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
