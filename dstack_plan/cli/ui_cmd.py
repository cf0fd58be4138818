"""`dstack ui`: the read-only HTTP API (and UI) of a project, without reconciling anything."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.project import Project
    from dstack_plan.proxy.server import ServiceProxy
    from dstack_plan.web.history import History
    from dstack_plan.web.server import WebServer

BindOpt = typer.Option(
    "127.0.0.1:3000",
    "--bind",
    help="HOST:PORT to listen on (port 0: any free one). Any address but 127.0.0.1, ::1 or "
    "localhost wants the bearer token in .dstack/ui-token (made and printed on first use).",
)


def ui(
    directory: Path = common.DirArg,
    state: str = common.StateOpt,
    bind: str = BindOpt,
) -> None:
    """Serve the project's runs, jobs, hosts, events, plan and logs over HTTP, read-only.

    Reads state and asks agents as `dstack ps` does: no lock, no lease, nothing written. The
    endpoints (JSON under /api/, the OpenAPI document at /openapi.json) are in docs/api.md.
    Metrics history is only kept by `dstack watch --ui`. Ctrl-C stops it (exit 0).
    """
    project = common.make_project(directory, [], state)

    async def work(project: Project) -> None:
        import asyncio

        server = await serve_ui(project, bind, directory, state, None)
        try:
            await asyncio.Event().wait()  # until Ctrl-C
        finally:
            await server.close()

    try:
        common.run_with(project, work)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


async def serve_ui(
    project: Project,
    bind: str,
    directory: Path,
    state: str | None,
    history: History | None,
    proxy: ServiceProxy | None = None,
    tries: int = 1,
) -> WebServer:
    """Start the API over `project` (the watch's metrics ring `history`, if any; the
    services of `proxy` on the same port; from --bind's port up to `tries` ports); say
    where, and the token when this start made it."""
    from dstack_plan.cli.output import print_lines
    from dstack_plan.web.auth import UI_TOKEN_FILE, needs_token
    from dstack_plan.web.server import start_server
    from dstack_plan.web.source import ApiSource

    source = ApiSource(
        project, new_project=lambda: common.make_project(directory, [], state), history=history
    )
    server = await start_server(source, bind, project.directory, proxy, tries)
    lines = []
    if server.token_created is not None:  # the token appears once: in the browser's link
        lines.append(
            f"UI token, shown once (kept in {UI_TOKEN_FILE}): open "
            f"{server.url}?token={server.token_created} in a browser once (it keeps a cookie); "
            "scripts send it as `Authorization: Bearer TOKEN`"
        )
    elif needs_token(server.host):
        lines.append(
            f"The UI wants the token in {UI_TOKEN_FILE}: open {server.url}?token=TOKEN in a "
            "browser once, or send `Authorization: Bearer TOKEN`"
        )
    print_lines([*lines, f"UI: {server.url}"])
    sys.stdout.flush()
    return server
