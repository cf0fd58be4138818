"""Small records a backend keeps beside the state: the watch leader lease, the event log.

Each record is a named blob with a version token, written with compare-and-swap (like the
state itself): the local backend flocks a lock file beside it and replaces it atomically; an
object store would use `If-Match` / `If-None-Match: *`. Line logs (the event log) are appended
and trimmed to a bound. These helpers are shared by every backend; the backend methods are
`StateBackend.read_record`, `write_record` and `append_lines`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from dstack_plan.errors import StateError

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")


class RecordSnapshot(NamedTuple):
    """A record as read: its bytes (None when it does not exist) and the version to CAS on."""

    data: bytes | None
    version: str


def check_record_name(name: str) -> str:
    """`name` if it is a plain file name (`events.jsonl`); StateError otherwise.

    Backends map it to a path or key beside the state, so it must not climb out of there.
    """
    if not _NAME.match(name) or ".." in name:
        raise StateError(f"invalid record name {name!r}")
    return name


def complete_lines(data: bytes | None) -> list[bytes]:
    """The newline-terminated lines of `data`, without their newlines and without blank ones.

    A last line with no newline is left out: a writer may be appending it right now (or died
    doing so), so it is not a whole record yet.
    """
    if not data:
        return []
    whole, _, _partial = data.rpartition(b"\n")
    return [line for line in whole.split(b"\n") if line.strip()]


def joined(existing: bytes | None, lines: list[bytes]) -> bytes:
    """`existing` with `lines` appended, one per line; a torn last line is ended first so
    that the first new line is not glued to it."""
    head = existing or b""
    if head and not head.endswith(b"\n"):
        head += b"\n"
    return head + b"".join(line + b"\n" for line in lines)


def trimmed(data: bytes, *, keep_last: int, trim_past: int) -> bytes | None:
    """The last `keep_last` lines of `data` when it holds more than `trim_past`; else None.

    Trimming only once the log is well past its bound keeps rewrites rare: one rewrite per
    `trim_past - keep_last` appended lines.
    """
    lines = complete_lines(data)
    if len(lines) <= trim_past:
        return None
    return b"".join(line + b"\n" for line in lines[-keep_last:]) if keep_last > 0 else b""
