"""Starting and stopping the API server: `--bind HOST:PORT`, the token rule, the URL."""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from dstack_plan.errors import DstackPlanError
from dstack_plan.proxy.protocol_log import server_logger
from dstack_plan.proxy.server import ServiceProxy
from dstack_plan.web.app import build_app
from dstack_plan.web.auth import needs_token, ui_token
from dstack_plan.web.source import ApiSource

log = logging.getLogger(__name__)

DEFAULT_BIND = "127.0.0.1:3000"


def parse_bind(text: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` or `[IPV6]:PORT` (port 0: any free one)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise DstackPlanError(f"--bind {text!r}: expected HOST:PORT, e.g. {DEFAULT_BIND}")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise DstackPlanError(f"--bind {text!r}: write an IPv6 address in brackets, [::1]:3000")
    return host.strip("[]"), int(port)


@dataclass
class WebServer:
    host: str
    port: int
    token_created: str | None
    """The token, when this start made it (to be printed once); None otherwise."""
    _runner: web.AppRunner
    _source: ApiSource

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/"

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._source.close()


async def start_server(
    source: ApiSource,
    bind: str,
    project_dir: str | Path,
    proxy: ServiceProxy | None = None,
    tries: int = 1,
) -> WebServer:
    """Serve the API over `source` on `bind`; off loopback, with the project's UI token.
    With `proxy` (already `open`), the services on the same port (`build_app`). With
    `tries` above 1, a port in use moves on to the next one, up to `tries` ports (another
    project's watch or `dstack ui` may hold the first)."""
    host, port = parse_bind(bind)
    token, created = ui_token(project_dir) if needs_token(host) else (None, False)
    runner = web.AppRunner(
        build_app(source, token, proxy),
        handle_signals=False,
        access_log=None,
        shutdown_timeout=1.0,
        logger=server_logger(log, "the UI"),  # a request that does not parse: one brief line
    )
    await runner.setup()
    for attempt in range(max(tries, 1)):
        candidate = port + attempt if port else 0
        try:
            await web.TCPSite(runner, host, candidate).start()
            break
        except OSError as e:
            if e.errno != errno.EADDRINUSE or attempt + 1 >= tries or not port:
                await runner.cleanup()
                why = e.strerror or e
                raise DstackPlanError(f"cannot serve on {host}:{candidate}: {why}") from None
    bound = int(runner.addresses[0][1])
    return WebServer(host, bound, token if created else None, runner, source)
