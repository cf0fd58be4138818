"""The `s3` backend: the state as one S3 object, written with compare-and-swap on its ETag.

Objects, for a state at `team/state.json`:
- `team/state.json`: the state JSON, encrypted server-side (SSE-S3, or SSE-KMS with the
  location's key id), with the body's sha256 in `x-amz-meta-sha256`, checked on every read;
- `team/state.json.backup`: the previous version, only when the bucket has no versioning
  (with versioning S3 keeps every version; `history` lists them);
- `team/state.json.lock`: the operation lock (`state/s3_lock.py`);
- `team/state.json.<record>`: watch's records (`watch-lease.json`, `events.jsonl`).

Every write is a conditional PutObject (`If-Match` on the ETag read, `If-None-Match: *` for
the first one), so two writers can never both win; the loser gets StateConflictError and
`commit` re-reads and re-applies.

An endpoint that stops answering fails the command after a bound (`state/s3_wait.py`) with
a BackendUnresponsive that says what this backend committed and what not: "nothing was
committed", or which resources' commit is in doubt (a put that got no answer may or may not
have landed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dstack_plan.clock import Clock
from dstack_plan.errors import StateError
from dstack_plan.state import s3_lock
from dstack_plan.state.backend import (
    ABSENT,
    StateBackend,
    StateConflictError,
    StateSnapshot,
    StateVersion,
    prepare_write,
)
from dstack_plan.state.codec import parse_state
from dstack_plan.state.lock import LockInfo
from dstack_plan.state.model import State
from dstack_plan.state.records import RecordSnapshot, check_record_name
from dstack_plan.state.render import Renderer
from dstack_plan.state.s3_location import S3Location
from dstack_plan.state.s3_lock import S3LockHandle
from dstack_plan.state.s3_objects import (
    ANY_VERSION,
    SHA256_META,
    UNCHANGED,
    PreconditionFailed,
    S3Object,
    S3Objects,
    sha256_hex,
)
from dstack_plan.state.s3_wait import BackendUnresponsive, WaitBudget
from dstack_plan.state.secrets import SecretGuard

logger = logging.getLogger(__name__)

HISTORY_LIMIT = 20
S3_COMMIT_ATTEMPTS = 40
"""CAS retries for `commit`: unlike local, S3 writers race, and 20 at once need more than 10."""
_RESERVED_RECORDS = ("lock", "backup")
_JSON = "application/json"


class S3Backend(StateBackend):
    """State in an S3 object; see the module docstring."""

    commit_attempts = S3_COMMIT_ATTEMPTS
    commit_max_pause = 2.0
    """Racing writers pause up to this long: each attempt is a round trip (tens of ms), so
    writers spread over a wider window than local's, or twenty at once keep colliding."""

    def __init__(
        self,
        where: S3Location,
        *,
        secret_guard: SecretGuard | None = None,
        client: Any | None = None,
        budget: WaitBudget | None = None,
    ) -> None:
        self.where = where
        self.secret_guard = secret_guard if secret_guard is not None else SecretGuard()
        self.objects = S3Objects(where, client, budget=budget)
        self.backup_key = where.key + ".backup"
        self.lock_key = where.key + ".lock"
        self._versioning: bool | None = None
        self._versioning_lock = threading.Lock()
        self._last: tuple[State, str, bytes] | None = None
        """The object as this backend last read or wrote it (state, ETag, body): a read
        asks S3 for it only if it changed (If-None-Match), a write based on it sends no GET.
        A 10,000-resource state is 13 MB to fetch and half a second to parse."""
        self._renderer = Renderer()
        self._committed: list[int] = []
        """The serials this backend stored (this command's commits), for the message of an
        endpoint that stopped answering."""

    @property
    def location(self) -> str:
        return self.where.object_url

    @property
    def locator(self) -> str:
        return self.where.url()

    def versioning_enabled(self) -> bool:
        """True when the bucket keeps old versions; asked once per backend, then cached."""
        with self._versioning_lock:
            if self._versioning is None:
                self._versioning = self.objects.versioning_enabled()
            return self._versioning

    # --- an endpoint that does not answer ------------------------------------------------

    def _stored_so_far(self) -> str:
        """What this backend committed: nothing, or up to which serial."""
        if not self._committed:
            return "nothing was committed"
        return (
            f"this command's commits up to serial {max(self._committed)} are stored, nothing"
            " after them"
        )

    @contextmanager
    def _unresponsive(self, outcome: Callable[[], str] | None = None) -> Iterator[None]:
        """Say, in a BackendUnresponsive raised inside, what was committed and what not."""
        try:
            yield
        except BackendUnresponsive as err:
            if err.outcome is not None:
                raise
            raise err.with_outcome((outcome or self._stored_so_far)()) from None

    # --- state ---------------------------------------------------------------------------

    def _parse(self, obj: S3Object, source: str) -> State:
        """The state in `obj`, after checking its body against the stored sha256."""
        stored = obj.metadata.get(SHA256_META)
        if stored is not None and stored != sha256_hex(obj.body):
            raise StateError(
                f"{source}: the state object is corrupt or truncated: its sha256 does not"
                f" match the one stored with it ({len(obj.body)} bytes read). Restore an"
                " earlier version (`dstack state history`) or push a good copy."
            )
        return parse_state(obj.body, source)

    def _load(self) -> tuple[State | None, str, bytes]:
        last = self._last
        if last is None:
            obj = self.objects.get(self.where.key)
        else:
            found = self.objects.get_if_changed(self.where.key, last[1])
            if found is UNCHANGED:
                return last
            obj = found
        if obj is None:
            self._last = None
            return None, ABSENT, b""
        state = self._parse(obj, self.location)
        self._last = (state, obj.etag, obj.body)
        return self._last

    def read(self) -> StateSnapshot:
        with self._unresponsive():
            state, version, _ = self._load()
        return StateSnapshot(state if state is not None else State.empty(), version)

    def _conflict(self, current: str, expected: str) -> StateConflictError:
        return StateConflictError(
            f"{self.location}: state changed since it was read (ETag {current}, expected"
            f" {expected})",
            current=current,
            expected=expected,
        )

    def write(self, new_state: State, expected: str) -> StateSnapshot:
        self.secret_guard.check(new_state)
        last = self._last
        current: State | None
        if last is not None and last[1] == expected:
            # what this backend read or wrote as `expected`: the conditional put below
            # refuses the write if the object is no longer that version, so no GET is needed
            current, version, body = last
        else:
            with self._unresponsive(lambda: self._not_stored(None, None)):
                current, version, body = self._load()
        if version != expected:
            raise self._conflict(version, expected)
        to_write = prepare_write(current, new_state, self.location)
        if to_write is None:
            if current is None:  # nothing stored and nothing to store
                return StateSnapshot(new_state.model_copy(update={"serial": 0}), ABSENT)
            return StateSnapshot(current, version)
        try:
            with self._unresponsive(lambda: self._not_stored(current, to_write)):
                if current is not None and not self.versioning_enabled():
                    # the bytes just read and checked, not a server-side copy: the backup is
                    # then exactly the version this write replaces (and moto's concurrent
                    # CopyObject is racy)
                    self.objects.put(
                        self.backup_key, body, expected=ANY_VERSION, content_type=_JSON
                    )
            data = self._renderer.render(to_write)
            with self._unresponsive(lambda: self._in_doubt(current, to_write)):
                etag = self.objects.put(
                    self.where.key,
                    data,
                    expected=None if current is None else version,
                    content_type=_JSON,
                )
        except PreconditionFailed:
            self._last = None  # someone else wrote: read it anew next time
            raise self._conflict("(changed)", expected) from None
        except BackendUnresponsive:
            self._last = None  # the object may have changed: read it anew next time
            raise
        self._last = (to_write, etag, data)
        self._committed.append(to_write.serial)
        return StateSnapshot(to_write, etag)

    def _not_stored(self, current: State | None, new: State | None) -> str:
        """The outcome of a commit that failed before its state was sent."""
        return f"{_commit_of(current, new)} was not stored; {self._stored_so_far()}"

    def _in_doubt(self, current: State | None, new: State) -> str:
        """The outcome of a commit whose put got no answer: it may have landed."""
        stored = "nothing else was committed"
        if self._committed:
            stored = (
                f"this command's other commits, up to serial {max(self._committed)}, are stored"
            )
        return (
            f"{_commit_of(current, new)} is in doubt: it may or may not have been stored"
            f" (`dstack state list` tells once the backend answers); {stored}"
        )

    # --- earlier versions ----------------------------------------------------------------

    def history(self) -> list[StateVersion]:
        """Versions from S3 versioning when enabled, else the current object and its backup."""
        with self._unresponsive():
            return self._history()

    def _history(self) -> list[StateVersion]:
        found: list[StateVersion] = []
        if self.versioning_enabled():
            for entry in self.objects.versions(self.where.key, HISTORY_LIMIT):
                version_id = str(entry["VersionId"])
                obj = self.objects.get(self.where.key, version_id)
                found.extend(self._describe(obj, version_id, current=bool(entry["IsLatest"])))
            return found
        for key, current in ((self.where.key, True), (self.backup_key, False)):
            found.extend(self._describe(self.objects.get(key), key, current=current))
        return found

    def _describe(
        self, obj: S3Object | None, version_id: str, *, current: bool
    ) -> list[StateVersion]:
        if obj is None:
            return []
        try:
            state = self._parse(obj, f"{self.location} (version {version_id})")
        except StateError as err:  # list what can be listed; say what cannot
            logger.warning("%s", err)
            return []
        return [
            StateVersion(
                id=version_id,
                serial=state.serial,
                lineage=state.lineage,
                written_at=obj.last_modified,
                current=current,
            )
        ]

    def read_version(self, version_id: str) -> State:
        """The state stored as `version_id`: an S3 version id, or (unversioned) the key of the
        state or of its backup."""
        with self._unresponsive():
            return self._read_version(version_id)

    def _read_version(self, version_id: str) -> State:
        source = f"{self.location} (version {version_id})"
        if version_id in (self.where.key, self.backup_key):
            obj = self.objects.get(version_id)
        elif self.versioning_enabled():
            obj = self.objects.get(self.where.key, version_id)
        else:
            obj = None
        if obj is None:
            raise StateError(f"{source}: no such version; see `dstack state history`")
        return self._parse(obj, source)

    # --- records beside the state --------------------------------------------------------

    def record_key(self, name: str) -> str:
        """The object of record `name`: `team/state.json.events.jsonl`."""
        check_record_name(name)
        if name in _RESERVED_RECORDS:
            raise StateError(f"invalid record name {name!r}: reserved by the s3 backend")
        return f"{self.where.key}.{name}"

    def read_record(self, name: str) -> RecordSnapshot:
        key = self.record_key(name)
        with self._unresponsive():
            obj = self.objects.get(key)
        return RecordSnapshot(None, ABSENT) if obj is None else RecordSnapshot(obj.body, obj.etag)

    def write_record(self, name: str, data: bytes | None, expected: str) -> str:
        key = self.record_key(name)
        with self._unresponsive():
            return self._write_record(key, data, expected)

    def _write_record(self, key: str, data: bytes | None, expected: str) -> str:
        try:
            if data is not None:
                condition = None if expected == ABSENT else expected
                return self.objects.put(key, data, expected=condition, content_type=_JSON)
            if expected != ABSENT:
                self.objects.delete(key, expected=expected)
            elif self.objects.get(key) is not None:  # deleting "nothing": only if still so
                raise PreconditionFailed("exists")
            return ABSENT
        except PreconditionFailed:
            raise StateConflictError(
                f"{self.objects.url(key)}: changed since it was read",
                current="(changed)",
                expected=expected,
            ) from None

    # --- operation lock ------------------------------------------------------------------

    def try_lock(self, operation: str, who: str, ttl: float, clock: Clock) -> S3LockHandle:
        with self._unresponsive():
            return s3_lock.try_lock(
                self.objects,
                self.lock_key,
                location=self.location,
                operation=operation,
                who=who,
                ttl=ttl,
                clock=clock,
            )

    def unlock(self, lock_id: str) -> None:
        with self._unresponsive():
            s3_lock.unlock(self.objects, self.lock_key, location=self.location, lock_id=lock_id)

    def read_lock_info(self) -> LockInfo | None:
        with self._unresponsive():
            obj = s3_lock.read_lock(self.objects, self.lock_key)
        return None if obj is None else LockInfo.parse(obj.body)


def _commit_of(current: State | None, new: State | None) -> str:
    """`the commit of task.a, fleet.b` (the addresses whose entries it changes), for
    messages; `this commit` when that is not known."""
    if new is None:
        return "this commit"
    before = current.resources if current is not None else {}
    after = new.resources
    changed = sorted(a for a in before.keys() | after.keys() if before.get(a) != after.get(a))
    if not changed:
        return "this commit"
    shown = ", ".join(changed[:5])
    if len(changed) > 5:
        shown += f" and {len(changed) - 5} more"
    return f"the commit of {shown}"
