"""The operation lock of the s3 backend: an object `<key>.lock` holding the LockInfo JSON.

Taken with `If-None-Match: *`, renewed with `If-Match` on its ETag, released by a delete
conditional on that ETag. A holder that dies stops renewing; the next `try_lock` takes the
lock over (a conditional put on the dead holder's ETag, so two takers cannot both win) and
logs a warning naming who held it: at once when the holder ran on this machine (in this PID
space) and its process is gone, else once its `expires` has passed. Only the holder's ETag
can renew or release, so a holder whose lock was taken over finds out (LockError) instead of
overwriting the new owner's record.
"""

from __future__ import annotations

import logging
import os

from dstack_plan.clock import Clock
from dstack_plan.errors import LockError, StateError
from dstack_plan.state.lock import LockHandle, LockInfo, lock_held_error
from dstack_plan.state.s3_objects import PreconditionFailed, S3Object, S3Objects
from dstack_plan.state.s3_wait import BackendUnresponsive

logger = logging.getLogger(__name__)

LOCK_CONTENT_TYPE = "application/json"
_TAKE_ATTEMPTS = 5


class S3LockHandle(LockHandle):
    """A held `<key>.lock`; remembers the ETag of the record it last wrote."""

    def __init__(
        self, objects: S3Objects, key: str, info: LockInfo, etag: str, *, ttl: float, clock: Clock
    ) -> None:
        super().__init__(info, ttl=ttl, clock=clock)
        self._objects = objects
        self._key = key
        self._etag = etag

    def _store_renewal(self, info: LockInfo) -> None:
        body = info.to_json().encode("utf-8")
        try:
            self._etag = self._objects.put(
                self._key, body, expected=self._etag, content_type=LOCK_CONTENT_TYPE
            )
        except PreconditionFailed:
            current = read_lock(self._objects, self._key)
            holder = LockInfo.parse(current.body) if current else None
            now = f" it is now held by {holder.who} (lock {holder.id})" if holder else ""
            raise LockError(
                f"{self._objects.url(self._key)}: lost the state lock {info.id}:{now}."
                " Another operation took it over after it expired.",
                holder,
            ) from None

    def _release(self) -> None:
        try:
            self._objects.delete(self._key, expected=self._etag)
        except PreconditionFailed:
            # taken over (or force-unlocked) meanwhile: the object is someone else's now
            logger.warning(
                "%s: the state lock %s was no longer ours at release; left it in place",
                self._objects.url(self._key),
                self.info.id,
            )
        except StateError as err:
            # Not worth failing a command that did its work (nor hiding the error of one
            # that did not): the lock is left, and goes once this process has exited.
            logger.warning(
                "could not release the state lock %s: %s\nThe next operation on this"
                " machine takes it over; elsewhere `dstack state unlock %s` removes it (or"
                " wait until its lease runs out at %s).",
                self.info.id,
                err,
                self.info.id,
                self.info.expires.strftime("%Y-%m-%d %H:%M:%S UTC"),
            )


def read_lock(objects: S3Objects, key: str) -> S3Object | None:
    """The lock object, or None when the state is not locked."""
    return objects.get(key)


def _expired(current: S3Object, holder: LockInfo | None, ttl: float, clock: Clock) -> bool:
    """Whether the lock in `current` may be taken over: its holder's lease has run out.

    A record that does not parse (damaged by hand: writers put whole objects) has no
    `expires`; it counts as expired once untouched for a whole `ttl`, so it cannot block
    everyone forever.
    """
    if holder is not None:
        return holder.is_expired(clock.now())
    written = current.last_modified
    return written is not None and written.timestamp() + ttl <= clock.now()


def try_lock(
    objects: S3Objects,
    key: str,
    *,
    location: str,
    operation: str,
    who: str,
    ttl: float,
    clock: Clock,
) -> S3LockHandle:
    """Create the lock object, or take it over if its holder is gone or let it expire;
    LockError naming the holder (and how to unlock it) if it is held."""
    info = LockInfo.new(
        operation=operation, who=who, path=location, ttl=ttl, clock=clock, pid=os.getpid()
    )
    body = info.to_json().encode("utf-8")

    def put(expected: str | None) -> str:
        try:
            return objects.put(key, body, expected=expected, content_type=LOCK_CONTENT_TYPE)
        except BackendUnresponsive as err:  # the put may have landed after all
            raise err.with_note(
                f"The lock {objects.url(key)} may have been taken as {info.id}: the next"
                " operation on this machine takes it over once this one has exited;"
                f" elsewhere `dstack state unlock {info.id}` removes it"
            ) from None

    for _ in range(_TAKE_ATTEMPTS):
        try:
            etag = put(None)
            return S3LockHandle(objects, key, info, etag, ttl=ttl, clock=clock)
        except PreconditionFailed:
            pass
        current = read_lock(objects, key)
        if current is None:
            continue  # released between our put and our read: try again
        holder = LockInfo.parse(current.body)
        gone = holder is not None and holder.holder_gone()
        if not gone and not _expired(current, holder, ttl, clock):
            raise lock_held_error(location, holder, clock.now())
        try:
            etag = put(current.etag)
        except PreconditionFailed:
            continue  # renewed, released or taken by someone else meanwhile: look again
        if holder is None:
            logger.warning("%s: took over an unreadable state lock record", location)
        elif gone:
            logger.warning(
                "%s: took over the lock of %s by %s (pid %s, which no longer runs; lock %s)",
                location,
                holder.operation,
                holder.who,
                holder.pid,
                holder.id,
            )
        else:
            logger.warning(
                "%s: took over the expired state lock %s of %s (operation %s, expired %s)",
                location,
                holder.id,
                holder.who,
                holder.operation,
                holder.expires.strftime("%Y-%m-%d %H:%M:%S UTC"),
            )
        return S3LockHandle(objects, key, info, etag, ttl=ttl, clock=clock)
    raise StateError(f"{objects.url(key)}: the lock keeps changing hands; try again")


def unlock(objects: S3Objects, key: str, *, location: str, lock_id: str) -> None:
    """Remove the lock if its id is `lock_id`; LockError when unlocked or someone else's."""
    current = read_lock(objects, key)
    if current is None:
        raise LockError(f"{location} is not locked", None)
    holder = LockInfo.parse(current.body)
    if holder is None or holder.id != lock_id:
        whose = f"{holder.id}, held by {holder.who}" if holder else "an unreadable record"
        raise LockError(
            f"lock id {lock_id} does not match the lock on {location} ({whose})", holder
        )
    try:
        objects.delete(key, expected=current.etag)
    except PreconditionFailed:
        raise LockError(
            f"{location}: the lock changed while unlocking it; check `dstack state` again",
            holder,
        ) from None
