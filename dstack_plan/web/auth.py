"""Who may read the API: anyone on this machine when it listens on loopback, and only clients
with the project's UI token (`Authorization: Bearer TOKEN`) when it listens anywhere else.

"Loopback" is exactly `127.0.0.1`, `::1` and `localhost`: any other address, even another
one of 127.0.0.0/8, wants the token. The token is made on first use and kept 0600 in
`.dstack/ui-token`; it is compared in constant time. Only GET and HEAD are answered: any
other method is a 405, before the token is even looked at (nothing here writes).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from dstack_plan.proxy.token import ensure_token

UI_TOKEN_FILE = Path(".dstack") / "ui-token"
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
READ_METHODS = frozenset({"GET", "HEAD"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def needs_token(host: str) -> bool:
    """Whether listening on `host` needs the token (anything but loopback)."""
    return host.strip("[]") not in LOOPBACK


def ui_token(project_dir: str | Path) -> tuple[str, bool]:
    """The project's UI token, and whether it was made just now (to print it once)."""
    return ensure_token(project_dir, UI_TOKEN_FILE)


def authorized(header: str, token: str) -> bool:
    """Whether an `Authorization` header value carries `token` as a bearer token."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def access_middleware(token: str | None) -> Middleware:
    """Refuse other methods than GET and HEAD (405), and, with a `token`, requests without
    it (401)."""

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            raise web.HTTPMethodNotAllowed(request.method, sorted(READ_METHODS))
        if token is not None and not authorized(request.headers.get("Authorization", ""), token):
            raise web.HTTPUnauthorized(
                headers={"WWW-Authenticate": 'Bearer realm="dstack ui"'},
                text="a bearer token is needed: Authorization: Bearer <.dstack/ui-token>",
            )
        return await handler(request)

    return access
