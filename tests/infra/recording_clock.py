"""A fake clock that remembers what it was asked to sleep, for tests that assert how code
waits (its backoff steps, the timeout it was given) instead of timing it."""

from __future__ import annotations

from collections.abc import Callable

from dstack_plan.clock import FakeClock


class RecordingClock(FakeClock):
    """A `FakeClock` (it moves only when slept on or advanced) keeping every `sleep` asked
    of it in `sleeps`; `on_sleep(seconds)`, if given, runs at each one before the clock
    moves (to make something happen "while" the code waits)."""

    def __init__(
        self,
        start: float = 1_700_000_000.0,
        on_sleep: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(start)
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep(seconds)
        await super().sleep(seconds)
