"""Ctrl-C and SIGTERM during an apply: the first stops gracefully, the second aborts.

The engine subscribes to an `Interrupt`; the CLI installs it as the loop's signal handler:

    interrupt = Interrupt()
    with interrupt.signal_handlers():
        report = await apply_plan(..., interrupt=interrupt)
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)

Listener = Callable[[int], None]
"""Called with the number of interrupts received so far (1: stop, 2 or more: abort)."""


class Interrupt:
    """Counts interrupt requests and tells listeners; all calls happen on the loop's thread."""

    def __init__(self) -> None:
        self._count = 0
        self._listeners: list[Listener] = []

    @property
    def count(self) -> int:
        """How many interrupts were received."""
        return self._count

    @property
    def stopping(self) -> bool:
        """True after the first interrupt: start no new work."""
        return self._count >= 1

    @property
    def aborting(self) -> bool:
        """True after the second interrupt: abandon work in progress."""
        return self._count >= 2

    def trigger(self) -> None:
        """Record one interrupt (what a signal does); for tests and programmatic stops.

        Must run on the event loop's thread; from another thread use
        `loop.call_soon_threadsafe(interrupt.trigger)`.
        """
        self._count += 1
        for listener in list(self._listeners):
            try:
                listener(self._count)
            except Exception:  # one broken listener must not keep the others from stopping
                logger.exception("interrupt listener failed")

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` on every further interrupt; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    @contextmanager
    def signal_handlers(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
    ) -> Iterator[None]:
        """Route `signals` to `trigger` on `loop` (default: the running one) for the body.

        The previous Python-level handlers are restored afterwards. Where the loop cannot
        take signal handlers (not the main thread, Windows) the body runs without them.
        """
        loop = loop or asyncio.get_running_loop()
        installed: list[tuple[signal.Signals, Any]] = []
        try:
            for sig in signals:
                previous = signal.getsignal(sig)
                try:
                    loop.add_signal_handler(sig, self.trigger)
                except (NotImplementedError, RuntimeError, ValueError) as err:
                    logger.debug("cannot handle %s on this loop: %s", sig.name, err)
                    continue
                installed.append((sig, previous))
            yield
        finally:
            for sig, previous in reversed(installed):
                loop.remove_signal_handler(sig)
                # remove_signal_handler resets to the default handler, not to the old one
                if previous is not None:
                    signal.signal(sig, previous)
