"""The operation lock of the s3 backend: an object `<key>.lock` holding the LockInfo JSON.

Taken with `If-None-Match: *`, renewed with `If-Match` on its ETag, released by a delete
conditional on that ETag. A holder that dies stops renewing; once its `expires` has passed
the next `try_lock` takes the lock over (a conditional put on the dead holder's ETag, so two
takers cannot both win) and logs a warning naming who held it. Only the holder's ETag can
renew or release, so a holder whose lock was taken over finds out (LockError) instead of
overwriting the new owner's record.
"""

from __future__ import annotations

import logging
import os

from dstack_plan.clock import Clock
from dstack_plan.errors import LockError, StateError
from dstack_plan.state.lock import LockHandle, LockInfo, lock_held_error
from dstack_plan.state.s3_objects import PreconditionFailed, S3Object, S3Objects

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
    """Create the lock object, or take it over if its holder let it expire; LockError if held."""
    info = LockInfo.new(
        operation=operation, who=who, path=location, ttl=ttl, clock=clock, pid=os.getpid()
    )
    body = info.to_json().encode("utf-8")
    for _ in range(_TAKE_ATTEMPTS):
        try:
            etag = objects.put(key, body, expected=None, content_type=LOCK_CONTENT_TYPE)
            return S3LockHandle(objects, key, info, etag, ttl=ttl, clock=clock)
        except PreconditionFailed:
            pass
        current = read_lock(objects, key)
        if current is None:
            continue  # released between our put and our read: try again
        holder = LockInfo.parse(current.body)
        if not _expired(current, holder, ttl, clock):
            raise lock_held_error(location, holder)
        try:
            etag = objects.put(key, body, expected=current.etag, content_type=LOCK_CONTENT_TYPE)
        except PreconditionFailed:
            continue  # renewed, released or taken by someone else meanwhile: look again
        if holder is None:
            logger.warning("%s: took over an unreadable state lock record", location)
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
