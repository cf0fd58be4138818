"""A log line at most once per interval, for the HTTP servers' protocol errors (the agent's,
and the controller's aiohttp ones through `proxy/protocol_log.py`). Standard library only:
the agent imports it on hosts with nothing but python3."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

INTERVAL = 60.0
"""At most one protocol-error line per this many seconds per server."""


class RateLimited:
    """Logs at most one warning per `interval` seconds (`now` tells the time) to `logger`; the
    next one logged says how many were suppressed since the last."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = INTERVAL,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._now = now
        self._lock = threading.Lock()
        self._next_at: float | None = None
        self.suppressed = 0
        """Lines left out since the last one logged."""

    def warning(self, message: str, *args: object, exc_info: bool = False) -> bool:
        """Log `message % args` unless a line went out less than `interval` ago (then it is
        only counted); whether it was logged."""
        with self._lock:
            now = self._now()
            if self._next_at is not None and now < self._next_at:
                self.suppressed += 1
                return False
            self._next_at = now + self._interval
            suppressed, self.suppressed = self.suppressed, 0
        if suppressed:
            message += " (%d more such since the last line, not logged)"
            args = (*args, suppressed)
        self._logger.warning(message, *args, exc_info=exc_info or None)
        return True
