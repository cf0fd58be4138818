"""`dstack watch`: keep the project's runs reconciled with their agents after apply."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common
from dstack_plan.cli.ui_cmd import BindOpt

LEASE_TTL = 15.0
"""Seconds a leader's lease lasts unrenewed: a standby acts within this (plus a tick) after the
leader dies."""
LEASE_ENV = "DSTACK_PLAN_WATCH_LEASE"
"""Sets the leader's lease (seconds, or a duration such as `90s`, `10m`) instead of 15 s."""

if TYPE_CHECKING:
    from dstack_plan.project import Project
    from dstack_plan.proxy.server import ServiceProxy
    from dstack_plan.watch.loop import Reporter
    from dstack_plan.watch.model import TickReport
    from dstack_plan.watch.serving import Serving
    from dstack_plan.web.history import History
    from dstack_plan.web.server import WebServer


def watch(
    directory: Path = common.DirArg,
    state: str = common.StateOpt,
    interval: str = typer.Option("5s", "--interval", help="Time between ticks (5s, 1m)."),
    once: bool = typer.Option(False, "--once", help="Run one tick and exit."),
    metrics_port: int = typer.Option(
        None,
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus metrics on 127.0.0.1:PORT (e.g. 9464).",
    ),
    metrics_file: Path = typer.Option(
        None, "--metrics-file", help="Write the metrics to this file after every tick."
    ),
    proxy_port: int = typer.Option(
        None,
        "--proxy-port",
        min=0,
        max=65535,
        help="Serve the services on 127.0.0.1:PORT/proxy/services/NAME/ (e.g. 8080).",
    ),
    proxy_host: str = typer.Option(
        "127.0.0.1",
        "--proxy-host",
        help="The address --proxy-port listens on (another than 127.0.0.1 exposes every "
        "service with `auth: false` to that network).",
    ),
    ui: bool = typer.Option(
        False,
        "--ui",
        help="With --proxy-port: also serve the read-only HTTP API and UI on --bind. "
        "(Without --proxy-port the UI is served by default.)",
    ),
    bind: str = BindOpt,
    serve: bool = typer.Option(
        True,
        "--serve/--no-serve",
        help="While this watch leads, serve the UI, its API and the services on --bind "
        "(127.0.0.1:3000, or the next free port).",
    ),
) -> None:
    """Reconcile the runs in state with what their agents report, tick after tick.

    Each tick asks every agent for its jobs (one request per agent), stops the surviving nodes
    of a multi-node task that failed (or whose master is done with stop_criteria
    master-done), and commits the statuses it found. It never takes the apply lock: apply
    and watch run side by side. Jobs run on their agents, not here: killing watch stops
    nothing, and a watch started again carries on. Ctrl-C exits 0. Metrics (Prometheus
    text: runs and jobs by status, GPU utilisation and memory per host, queue depth, tick
    duration...) are served on 127.0.0.1 with --metrics-port, or written with --metrics-file;
    examples/monitoring/ has a Grafana dashboard of them.

    While it holds the leader lease, watch serves, as dstack's server does, on --bind
    (127.0.0.1:3000; the next free port, with a warning, when another project's watch or
    `dstack ui` holds it): the read-only UI and API (docs/api.md, with the metrics of the
    last hours), and every service's running replicas at /proxy/services/NAME/ (each reached
    through SSH, health-checked, streamed; `auth: true` services want `Authorization:
    Bearer` and the token in .dstack/service-token). It scales services with `scaling` by
    their requests per second (docs/watch-policy.md) and holds the SSH tunnels of the
    gateways' requests. A standby watch binds nothing until it leads; --once and --no-serve
    never bind. `dstack ps` shows each service's URL, or why it is not served. --proxy-port
    serves the services on a port of their own instead (--proxy-host to listen elsewhere;
    --ui adds the UI on --bind). With --log-format json (a global option, before `watch`),
    every status change, retry and stop is also a JSON line on stderr (ts, level, event,
    address, job_id, host, resource_type, span_id, ...).
    """
    from dstack_plan.config.units import parse_duration
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.state.env import env_seconds
    from dstack_plan.state.events import EventLog
    from dstack_plan.state.lease import LeaderLease, new_holder_id
    from dstack_plan.watch.actors import default_actors
    from dstack_plan.watch.events import LoggedEventLog
    from dstack_plan.watch.leading import ServeWhileLeading
    from dstack_plan.watch.loop import Watcher
    from dstack_plan.watch.metrics import WatchMetrics

    try:
        seconds = float(parse_duration(interval))
    except ValueError as e:
        try:  # fractions of a second too (tests, demos): 0.5s
            seconds = float(interval.removesuffix("s"))
        except ValueError:
            raise DstackPlanError(f"--interval {interval!r}: {e}") from None
    if seconds <= 0:
        raise DstackPlanError("--interval must be more than 0s")
    project = common.make_project(directory, [], state)

    def report(tick: TickReport, changes: list[tuple[str, str, str]]) -> None:
        from datetime import datetime, timezone

        from dstack_plan.cli.output import print_lines

        at = datetime.fromtimestamp(tick.started_at, tz=timezone.utc).strftime("%H:%M:%S")
        print_lines([f"{at} {address}: {old} -> {new}" for address, old, new in changes])

    metrics = WatchMetrics()
    history = None
    # the UI served by default (not --once, not --no-serve) keeps the metrics of the last hours
    serves_by_default = serve and proxy_port is None and not once
    if ui or serves_by_default:
        from dstack_plan.web.history import History

        history = History(project.clock)

    def export(tick: TickReport, changes: list[tuple[str, str, str]]) -> None:
        metrics.observe(tick)
        if metrics_file is not None:
            metrics.write_file(metrics_file)

    async def work(project: Project) -> None:
        server = metrics.serve(metrics_port) if metrics_port is not None else None
        if server is not None:
            from dstack_plan.cli.output import print_lines

            print_lines([f"Metrics: http://{server.host}:{server.port}/metrics"])
            sys.stdout.flush()
        web: WebServer | None = None
        serving: Serving | None = None
        leading: ServeWhileLeading | None = None
        try:
            if ui and proxy_port is not None:
                from dstack_plan.cli.ui_cmd import serve_ui

                web = await serve_ui(project, bind, directory, state, history)
            lease = LeaderLease(
                project.backend,
                new_holder_id(),
                ttl=env_seconds(LEASE_ENV, LEASE_TTL),
                clock=project.clock,
            )
            # Every event watch records is also a log line (`--log-format json` for
            # collectors) once logging is asked for; unasked, the lines printed above say it.
            logged = bool(logging.getLogger().handlers)
            log_class = LoggedEventLog if logged else EventLog
            events = log_class(project.backend, secret_guard=project.guard)
            if proxy_port is not None:
                serving = await _serve_services(project, proxy_host, proxy_port, lease.holder_id)
            elif not serves_by_default and not once and await _has_gateways(project):
                # --no-serve: a gateway's requests still need this proxy
                serving = await _serve_services(project, proxy_host, 0, lease.holder_id)
            actors = default_actors(serving)
            reporters: list[Reporter] = [report, export]
            if history is not None:  # the UI's metrics over time
                reporters.append(history.observe)
            watcher = Watcher(
                project, lease=lease, events=events, reporters=reporters, actors=actors
            )
            if serves_by_default:
                holder, kept = lease.holder_id, history

                async def start() -> Serving:
                    return await _serve_all(project, bind, directory, state, kept, holder)

                leading = ServeWhileLeading(watcher, start)
                watcher.on_lead = leading
            await watcher.run(seconds, once=once)
        finally:
            if server is not None:
                server.close()
            if leading is not None:
                await leading.close()
            if serving is not None:
                await serving.close()
            if web is not None:
                await web.close()

    try:
        common.run_with(project, work)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


async def _has_gateways(project: Project) -> bool:
    import asyncio

    from dstack_plan.gateways.served import needs_tunnels

    snapshot = await asyncio.to_thread(project.backend.read)
    return needs_tunnels(snapshot.state)


SERVE_TRIES = 20
"""Ports tried from --bind's when it is in use (3000, 3001, ...)."""


async def _serve_all(
    project: Project,
    bind: str,
    directory: Path,
    state: str | None,
    history: History | None,
    holder: str,
) -> Serving:
    """Serve the UI and the services on one port, from --bind's (the next free one when it
    is in use, with a warning); says where."""
    from dstack_plan.cli.output import notice, print_lines
    from dstack_plan.cli.ui_cmd import serve_ui
    from dstack_plan.proxy.token import TOKEN_FILE
    from dstack_plan.watch.serving import serve_services
    from dstack_plan.web.server import parse_bind

    host, wanted = parse_bind(bind)

    async def listen(proxy: ServiceProxy) -> WebServer:
        return await serve_ui(
            project, bind, directory, state, history, proxy=proxy, tries=SERVE_TRIES
        )

    serving = await serve_services(project, host, 0, holder, listen=listen)
    listener = serving.listener
    if listener is not None and wanted and listener.port != wanted:
        notice(
            f"port {wanted} is in use (another watch or `dstack ui`): serving on port "
            f"{listener.port}",
            event="port_in_use",
            warning=True,
        )
    print_lines([
        f"Services: {serving.url}/proxy/services/NAME/ (auth: Bearer token in {TOKEN_FILE})"
    ])  # fmt: skip
    sys.stdout.flush()
    return serving


async def _serve_services(project: Project, host: str, port: int, holder: str) -> Serving:
    """Start serving the services for the watch holding (or wanting) lease `holder`; says
    where."""
    from dstack_plan.cli.output import print_lines
    from dstack_plan.proxy.token import TOKEN_FILE
    from dstack_plan.watch.serving import serve_services

    serving = await serve_services(project, host, port, holder)
    print_lines([
        f"Services: {serving.url}/proxy/services/NAME/ (auth: Bearer token in {TOKEN_FILE})"
    ])  # fmt: skip
    sys.stdout.flush()
    return serving
