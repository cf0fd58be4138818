"""The operation lock held by apply and destroy: lock records, handles and the wait loop.

Backends implement one non-blocking attempt (`StateBackend.try_lock`); waiting with backoff,
renewal and the readable contention message are shared here so every backend behaves alike.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import socket
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.clock import Clock, SystemClock
from dstack_plan.errors import LockError, StateError
from dstack_plan.state.canonical import canonical_json
from dstack_plan.state.env import env_seconds, format_seconds
from dstack_plan.state.liveness import process_gone, this_process
from dstack_plan.state.model import Timestamp, timestamp

logger = logging.getLogger(__name__)

DEFAULT_LOCK_TTL = 300.0
"""Seconds a lock stays valid without renewal; `hold_lock` renews it every third of that."""
LOCK_LEASE_ENV = "DSTACK_PLAN_LOCK_LEASE"
"""Sets the lock's lease (seconds, or a duration such as `90s`, `10m`) instead of 5 minutes."""
INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 8.0


def default_who() -> str:
    """`user@hostname`, the default lock holder description."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in the environment or passwd (some containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


class LockInfo(BaseModel):
    """Who holds the operation lock, for what, since when and until when (unless renewed)."""

    # Lock records are only displayed and compared by id, so fields added by a newer
    # version must not make an older one unable to show who holds the lock. Built on first
    # use: `plan` never takes the lock.
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    id: str
    operation: str
    who: str
    created: Timestamp
    expires: Timestamp
    path: str
    pid: int | None = None
    host: str | None = None
    """The holder's hostname."""
    pid_space: str | None = None
    """The PID space `pid` is in (`state/liveness.py`): only a process in the same one can
    tell from `pid` whether the holder still runs."""
    pid_start: int | None = None
    """When the holder's process started: tells a reused pid from the holder."""

    @classmethod
    def new(
        cls, *, operation: str, who: str, path: str, ttl: float, clock: Clock, pid: int | None
    ) -> LockInfo:
        """A fresh record with a random id, created now and expiring after `ttl` seconds.

        With this process's pid, the record also says where the process runs, so that a
        process of the same machine can tell once it is gone (`holder_gone`).
        """
        now = timestamp(clock)
        space: str | None = None
        started: int | None = None
        if pid is not None:
            this_pid, this_space, this_start = this_process()
            if pid == this_pid:
                space, started = this_space, this_start
        return cls(
            id=str(uuid.uuid4()),
            operation=operation,
            who=who,
            created=now,
            expires=now + timedelta(seconds=ttl),
            path=path,
            pid=pid,
            host=socket.gethostname(),
            pid_space=space,
            pid_start=started,
        )

    @classmethod
    def parse(cls, data: bytes | str) -> LockInfo | None:
        """The record in `data`, or None when it is empty or unreadable (being written)."""
        try:
            return cls.model_validate_json(data)
        except (ValidationError, ValueError):
            return None

    def renewed(self, *, ttl: float, clock: Clock) -> LockInfo:
        """The same lock with `expires` pushed to now + `ttl`."""
        return self.model_copy(update={"expires": timestamp(clock) + timedelta(seconds=ttl)})

    def is_expired(self, now: float) -> bool:
        """True once `now` (epoch seconds) is past `expires`."""
        return now >= self.expires.timestamp()

    def holder_gone(self) -> bool:
        """True when the holder ran on this machine (in this PID space) and its process no
        longer runs (killed, crashed; or its pid now runs another program): its lock need
        not be waited out. False when that cannot be told from here."""
        return process_gone(self.pid, self.pid_space, self.pid_start)

    def age(self, now: float) -> str:
        """How long ago the lock was taken, for messages: `3m12s`."""
        return format_seconds(max(0.0, now - self.created.timestamp()))

    def process(self) -> str:
        """The holder's process for messages: `pid 4242 on ci-runner-7`, `pid 4242`."""
        pid = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        return f"{pid} on {self.host}" if self.host else pid

    def to_json(self) -> str:
        """Canonical JSON of the record (what a backend stores)."""
        return canonical_json(self.model_dump(mode="json", exclude_none=True))

    def describe(self) -> str:
        """A readable `Lock Info:` block for error messages."""
        rows = [
            ("ID", self.id),
            ("Path", self.path),
            ("Operation", self.operation),
            ("Who", self.who),
            ("Created", self.created.strftime("%Y-%m-%d %H:%M:%S UTC")),
            ("Expires", self.expires.strftime("%Y-%m-%d %H:%M:%S UTC")),
        ]
        if self.host is not None:
            rows.append(("Host", self.host))
        if self.pid is not None:
            rows.append(("PID", str(self.pid)))
        return "Lock Info:\n" + "\n".join(f"  {k + ':':<11}{v}" for k, v in rows)


def lock_lease() -> float:
    """The lock's lease in seconds: $DSTACK_PLAN_LOCK_LEASE, else 5 minutes."""
    return env_seconds(LOCK_LEASE_ENV, DEFAULT_LOCK_TTL)


def lock_held_error(
    location: str, holder: LockInfo | None, now: float | None = None, *, local: bool = False
) -> LockError:
    """The error for a lock held by someone else: who holds it, since when, and how to get
    it (wait, `--lock-timeout`, or `dstack state unlock ID` once its holder is gone).

    `local` for a lock that lives as long as its holder's process (the local backend's
    flock): then the holder runs, and stopping it is what frees the lock. `now` (epoch
    seconds, default the system clock's) dates the holder's age.
    """
    if now is None:
        now = SystemClock().now()
    if holder is None:
        return LockError(
            f"Error acquiring the state lock: {location} is locked by another operation.\n"
            "Lock Info: (not readable yet: the holder is still writing it)\n"
            "Wait for that operation to finish, or retry with --lock-timeout SECONDS.",
            None,
        )
    head = (
        f"Error acquiring the state lock: {location} is locked by another operation:"
        f" {holder.operation} by {holder.who} ({holder.process()}), started"
        f" {holder.age(now)} ago.\n"
        f"{holder.describe()}\n"
    )
    unlock = f"dstack state unlock {holder.id}"
    if local:
        advice = (
            f"Wait for that {holder.operation} to finish (or retry with --lock-timeout"
            f" SECONDS), or stop its process ({holder.process()}): a local lock is released"
            f" when its process exits. `{unlock}` removes the lock only once no process holds"
            " it."
        )
    else:
        left = holder.expires.timestamp() - now
        lease = (
            f"Unless renewed, its lease runs out in {format_seconds(left)}"
            f" ({holder.expires.strftime('%Y-%m-%d %H:%M:%S UTC')}); then the next operation"
            " takes it over."
        )
        advice = (
            f"If that {holder.operation} still runs, wait for it to finish (or retry with"
            " --lock-timeout SECONDS). If it does not (killed, or its machine is gone),"
            f" remove the lock:\n  {unlock}\n{lease}"
        )
    return LockError(head + advice, holder)


class LockHandle(ABC):
    """A held operation lock. Release it exactly once: `release()` or a (async) with block."""

    def __init__(self, info: LockInfo, *, ttl: float, clock: Clock) -> None:
        self._info = info
        self._ttl = ttl
        self._clock = clock
        self._released = False

    @property
    def info(self) -> LockInfo:
        """The current lock record (its `expires` moves on each renewal)."""
        return self._info

    @property
    def released(self) -> bool:
        """True after `release()`."""
        return self._released

    def renew(self) -> LockInfo:
        """Push `expires` to now + ttl in the backend; LockError if the lock was lost."""
        if self._released:
            raise LockError(f"lock {self._info.id} was already released", self._info)
        info = self._info.renewed(ttl=self._ttl, clock=self._clock)
        self._store_renewal(info)
        self._info = info
        return info

    def release(self) -> None:
        """Give the lock up; calling it again does nothing."""
        if self._released:
            return
        self._released = True
        self._release()

    @abstractmethod
    def _store_renewal(self, info: LockInfo) -> None:
        """Persist the renewed record; raise LockError if someone else owns the lock now."""

    @abstractmethod
    def _release(self) -> None:
        """Remove the lock from the backend."""

    def __enter__(self) -> LockHandle:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    async def __aenter__(self) -> LockHandle:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


H = TypeVar("H")


async def acquire_with_backoff(attempt: Callable[[], H], *, timeout: float, clock: Clock) -> H:
    """Call `attempt` until it stops raising LockError or `timeout` seconds have passed.

    Waits 0.5 s, then doubles up to 8 s, never sleeping past the deadline (the last attempt
    happens at it). With `timeout <= 0` there is exactly one attempt.
    """
    deadline = clock.now() + max(0.0, timeout)
    delay = INITIAL_BACKOFF
    while True:
        try:
            return attempt()
        except LockError as err:
            remaining = deadline - clock.now()
            if remaining <= 0:
                if timeout > 0:
                    raise LockError(
                        f"{err}\nGave up after waiting {timeout:g}s for the lock.", err.holder
                    ) from None
                raise
            await clock.sleep(min(delay, remaining))
            delay = min(delay * 2, MAX_BACKOFF)


async def _keep_alive(handle: LockHandle, clock: Clock, interval: float) -> None:
    while True:
        await clock.sleep(interval)
        try:
            handle.renew()
        except LockError:
            logger.error("lost the state lock %s; stop and re-run", handle.info.id)
            return
        except (OSError, StateError) as err:  # transient: the next tick tries again
            logger.warning("could not renew the state lock %s: %s", handle.info.id, err)


class Lockable(Protocol):
    """What `hold_lock` needs of a backend: `StateBackend.lock` (every backend has it)."""

    async def lock(
        self,
        operation: str,
        *,
        who: str | None = None,
        timeout: float = 0.0,
        clock: Clock | None = None,
        ttl: float | None = None,
    ) -> LockHandle: ...


@asynccontextmanager
async def hold_lock(
    backend: Lockable,
    operation: str,
    *,
    who: str | None = None,
    timeout: float = 0.0,
    clock: Clock | None = None,
    ttl: float | None = None,
    renew: bool = True,
) -> AsyncIterator[LockHandle]:
    """Hold the operation lock for the body, renewing it every ttl/3 in the background.

    `ttl` defaults to `lock_lease()` ($DSTACK_PLAN_LOCK_LEASE, else 5 minutes). Pass
    `renew=False` with a FakeClock: a fake sleep returns at once, so the renewal loop would
    spin.
    """
    clock = clock or SystemClock()
    ttl = lock_lease() if ttl is None else ttl
    handle = await backend.lock(operation, who=who, timeout=timeout, clock=clock, ttl=ttl)
    renewer = asyncio.create_task(_keep_alive(handle, clock, ttl / 3)) if renew else None
    try:
        yield handle
    finally:
        if renewer is not None:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        handle.release()
