"""How long a command waits on an S3 endpoint that does not answer.

botocore's own timeouts bound one attempt (5 s to connect, 15 s per read), but a hung
endpoint (it accepts connections, then says nothing) costs every attempt its read timeout,
and a command makes many requests. So every request runs under a `WaitBudget`: it may wait
at most the bound (20 s, $DSTACK_PLAN_BACKEND_TIMEOUT) from the moment the endpoint stopped
answering, whatever its retries, and once it has gone that long without an answer the
command's next requests fail at once (`BackendUnresponsive`) instead of each waiting again.
Any answer (an error status too) ends the outage. A long-running command (`watch`) tries
afresh once the endpoint has been given up on for another bound.

A request that is given up on keeps running in its daemon thread until botocore's own
timeouts end it; its result is ignored (a write may still land: it is in doubt).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from dstack_plan.clock import Clock, SystemClock
from dstack_plan.errors import StateError
from dstack_plan.state.env import env_seconds, format_seconds

BACKEND_TIMEOUT_ENV = "DSTACK_PLAN_BACKEND_TIMEOUT"
DEFAULT_BACKEND_TIMEOUT = 20.0
"""Seconds a command waits on a state backend that does not answer before it fails."""

T = TypeVar("T")


def backend_timeout() -> float:
    """The bound in seconds: $DSTACK_PLAN_BACKEND_TIMEOUT, else 20."""
    return env_seconds(BACKEND_TIMEOUT_ENV, DEFAULT_BACKEND_TIMEOUT)


class BackendUnresponsive(StateError):
    """The state backend did not answer within the bound.

    `outcome` says what that means for the command's writes ("nothing was committed", a
    commit in doubt) and `note` what may be left behind (a lock); the backend adds them
    where it knows (`with_outcome`, `with_note`).
    """

    def __init__(
        self, backend: str, bound: float, outcome: str | None = None, note: str | None = None
    ) -> None:
        self.backend = backend
        self.bound = bound
        self.outcome = outcome
        self.note = note
        message = f"the state backend {backend} did not answer within {format_seconds(bound)}"
        if outcome:
            message += f"; {outcome}"
        if note:
            message += f". {note}"
        super().__init__(f"{message}\n(${BACKEND_TIMEOUT_ENV} sets how long to wait for it.)")

    def with_outcome(self, outcome: str) -> BackendUnresponsive:
        """The same error saying what was committed and what was not."""
        return BackendUnresponsive(self.backend, self.bound, outcome, self.note)

    def with_note(self, note: str) -> BackendUnresponsive:
        """The same error saying what else may be left behind."""
        return BackendUnresponsive(self.backend, self.bound, self.outcome, note)


class WaitBudget:
    """The time requests to one endpoint may still wait without an answer (thread-safe)."""

    def __init__(self, bound: float, clock: Clock | None = None) -> None:
        if bound <= 0:
            raise ValueError("bound must be positive")
        self.bound = bound
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._silent_since: float | None = None
        """When the first request that got no answer since the last answer started."""

    def allowance(self) -> float:
        """Seconds the next request may wait; 0 when it must fail at once."""
        with self._lock:
            if self._silent_since is None:
                return self.bound
            now = self._clock.now()
            left = self._silent_since + self.bound - now
            if left > 0:
                return left
            if now - self._silent_since >= 2 * self.bound:
                self._silent_since = None  # given up on a while ago: try it afresh
                return self.bound
            return 0.0

    def answered(self) -> None:
        """A request got an answer: the endpoint is alive."""
        with self._lock:
            self._silent_since = None

    def unanswered(self, started: float) -> None:
        """A request that started at `started` ended without an answer."""
        with self._lock:
            if self._silent_since is None or started < self._silent_since:
                self._silent_since = started

    def given_up(self, started: float) -> None:
        """A request that started at `started` waited all it was allowed: the endpoint has
        now gone the whole bound without answering (whatever two clocks say)."""
        with self._lock:
            since = min(started, self._clock.now() - self.bound)
            if self._silent_since is None or since < self._silent_since:
                self._silent_since = since

    def spent(self) -> bool:
        """True when the endpoint has gone the whole bound without answering."""
        with self._lock:
            silent = self._silent_since
        return silent is not None and self._clock.now() - silent >= self.bound

    def now(self) -> float:
        return self._clock.now()


def call_within(
    budget: WaitBudget,
    request: Callable[[], T],
    no_answer: Callable[[BaseException], bool],
    unresponsive: Callable[[], BackendUnresponsive],
) -> T:
    """Run `request` in a daemon thread, waiting at most what `budget` allows.

    Raises `unresponsive()` when the allowance runs out first (or is already spent), or
    when `request` failed without an answer (`no_answer(error)`) and the endpoint has now
    gone the whole bound without one; otherwise returns or raises what `request` did.
    """
    allowance = budget.allowance()
    if allowance <= 0:
        raise unresponsive()
    started = budget.now()
    outcome: list[T] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(request())
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            failure.append(err)
        finally:
            done.set()

    threading.Thread(target=run, name="s3-request", daemon=True).start()
    if not done.wait(allowance):
        budget.given_up(started)
        raise unresponsive()
    if failure:
        err = failure[0]
        if no_answer(err):
            budget.unanswered(started)
            if budget.spent():
                raise unresponsive() from err
        else:
            budget.answered()
        raise err
    budget.answered()
    return outcome[0]
