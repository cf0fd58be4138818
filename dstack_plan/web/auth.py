"""Who may read the API: anyone on this machine when it listens on loopback, and only clients
with the project's UI token (`Authorization: Bearer TOKEN`) when it listens anywhere else.

"Loopback" is exactly `127.0.0.1`, `::1` and `localhost`: any other address, even another
one of 127.0.0.0/8, wants the token. The token is made on first use and kept 0600 in
`.dstack/ui-token`; it is compared in constant time. Only GET and HEAD are answered: any
other method is a 405, before the token is even looked at (nothing here writes).

A browser cannot send that header from a plain link or an `EventSource`, so the token is also
accepted once as `?token=TOKEN`: the answer is a redirect to the same URL without it, setting
the cookie `dstack_ui_token` (HttpOnly, SameSite=Strict, path /), which every later request
of that browser carries and which is compared in constant time too.

On loopback, where no token is asked, a request must name loopback in its `Host:`
(`127.0.0.1`, `localhost` or `[::1]`, any port): a web page the user visits could otherwise
point a name of its own at 127.0.0.1 and read the API from the browser (DNS rebinding). Others
get a plain-text 421 (`proxy/loopback.py`).
"""

from __future__ import annotations

import hmac
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from dstack_plan.proxy.loopback import LOOPBACK, MISDIRECTED, host_allowed, refusal
from dstack_plan.proxy.token import ensure_token

UI_TOKEN_FILE = Path(".dstack") / "ui-token"
READ_METHODS = frozenset({"GET", "HEAD"})
COOKIE = "dstack_ui_token"


def needs_token(host: str) -> bool:
    """Whether listening on `host` needs the token (anything but loopback)."""
    return host.strip("[]") not in LOOPBACK


def ui_token(project_dir: str | Path) -> tuple[str, bool]:
    """The project's UI token, and whether it was made just now (to print it once)."""
    return ensure_token(project_dir, UI_TOKEN_FILE)


def authorized(header: str, token: str) -> bool:
    """Whether an `Authorization` header value carries `token` as a bearer token."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and same(given.strip(), token)


def same(given: str, token: str) -> bool:
    """`given == token`, in constant time."""
    return hmac.compare_digest(given.encode(), token.encode())


def with_cookie(request: web.Request, token: str) -> web.HTTPFound | None:
    """For a request with a right `?token=`: the redirect to its URL without it that sets the
    cookie; None otherwise."""
    given = request.query.get("token")
    if given is None or not same(given, token):
        return None
    query = request.url.query.copy()
    query.popall("token")
    redirect = web.HTTPFound(request.url.relative().with_query(query))
    redirect.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
    return redirect


def host_middleware(allowed: frozenset[str] | None) -> Middleware:
    """Refuse (421, plain text) a request whose `Host` is not one of `allowed` (None: any)."""

    @web.middleware
    async def host(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Host")
        if not host_allowed(given, allowed):
            return web.Response(status=MISDIRECTED, text=refusal(given))
        return await handler(request)

    return host


def access_middleware(token: str | None) -> Middleware:
    """Refuse other methods than GET and HEAD (405), and, with a `token`, requests without
    it (401): in the `Authorization` header, the cookie, or `?token=` (which sets the
    cookie)."""

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            raise web.HTTPMethodNotAllowed(request.method, sorted(READ_METHODS))
        if token is None:
            return await handler(request)
        redirect = with_cookie(request, token)
        if redirect is not None:
            raise redirect
        if not authorized(request.headers.get("Authorization", ""), token) and not same(
            request.cookies.get(COOKIE, ""), token
        ):
            raise web.HTTPUnauthorized(
                headers={"WWW-Authenticate": 'Bearer realm="dstack ui"'},
                text="a bearer token is needed: Authorization: Bearer <.dstack/ui-token> "
                "(in a browser, open the page once with ?token=<.dstack/ui-token>)",
            )
        return await handler(request)

    return access
