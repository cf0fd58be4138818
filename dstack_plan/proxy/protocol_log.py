"""Brief, rate-limited log lines for requests that do not parse, for the aiohttp servers (the
service proxy, the UI and API); and `brief(error)`, an HTTP client error fit for a log line.

Left alone, aiohttp logs each malformed request (bare LF line endings, a bad header, a line
too long) as an ERROR with a traceback whose message quotes the raw request bytes, the
`Authorization: Bearer` header included, once per bad request. `server_logger(...)` is
given to aiohttp as its `logger=`: such an error becomes one line, the peer address and the
kind of error (the exception's class, never its message), at most one line per interval per
server, the next one saying how many were left out. Everything else aiohttp logs (a
handler's unexpected exception) passes through to `aiohttp.server` as before.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from dstack_plan.agent.ratelimit import INTERVAL, RateLimited

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter


class _ServerLogger(_Adapter):
    """What aiohttp's request handler logs through (`logger=`): a protocol error as one
    rate-limited line; anything else to the wrapped logger as it is."""

    def __init__(self, what: str, limited: RateLimited) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self._what = what
        self._limited = limited

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        error = _exception(kwargs.get("exc_info"))
        if not isinstance(error, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        # aiohttp says "Error handling request from %s" with the peer as the first argument
        peer = args[0] if args and isinstance(msg, str) and msg.endswith("%s") else "a client"
        self._limited.warning(
            "%s: a malformed request from %s: %s (%s)",
            self._what,
            peer,
            type(error).__name__,
            error.code,
        )


def _exception(exc_info: object) -> BaseException | None:
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3:
        return exc_info[1] if isinstance(exc_info[1], BaseException) else None
    if exc_info:
        return sys.exc_info()[1]
    return None


def brief(error: BaseException) -> str:
    """An HTTP client's failure (the proxy's to a replica, a probe's) in one line: its class
    and the first line of its message, never its `repr` (a `ClientResponseError`'s holds the
    request's headers, `Authorization` included, and its `str` the URL with the query)."""
    if isinstance(error, aiohttp.ClientResponseError):
        text = f"{error.status} {error.message}"
    else:
        text = str(error)
    first = text.strip().splitlines()[0].rstrip(":") if text.strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def server_logger(
    logger: logging.Logger,
    what: str,
    interval: float = INTERVAL,
    now: Callable[[], float] = time.monotonic,
) -> Any:
    """The `logger=` for an aiohttp server (`web.Server`, `web.AppRunner`): its protocol
    errors go to `logger`, as lines that begin with `what` ("the service proxy")."""
    return _ServerLogger(what, RateLimited(logger, interval, now))
