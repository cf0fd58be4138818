"""A job's log on disk: byte offsets that only grow, size-capped by dropping the oldest segments.

Offsets count every byte ever appended, so a reader that reconnects with the offset it reached
loses and duplicates nothing, even across rotation and agent restarts. Rotation is never silent:
`first_offset` says where retained data starts and a marker line goes into the log itself.

Every append is also timed, coarsely (`agent/logtimes.py`: an index beside each segment, an
entry at most once a second of appends, rotated with its segment and counted towards
`max_bytes`): `offset_at(t)` starts a reader at the first byte that may have been appended at
or after `t` (nothing later is left out; at most a second of older output comes with it), and
`read_timed` dates what it returns.

Appends may carry a cursor (the docker runtime's position in the container's own log). The
cursor index lets a restarted agent drop bytes written after the last indexed cursor and fetch
them again from that cursor, so a crash between the two writes cannot duplicate output.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dstack_plan.agent.logtimes import DEFAULT_GRANULARITY, TimeIndex

_SEGMENT_SUFFIX = ".log"
_CURSOR_FILE = "cursor.idx"
_CURSOR_FILE_MAX = 256 * 1024


class LogStore:
    """The log of one job, in `directory`, keeping at most about `max_bytes` of recent output."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        segment_bytes: int | None = None,
        *,
        clock: Callable[[], float] = time.time,
        time_granularity: float = DEFAULT_GRANULARITY,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._times = TimeIndex(self.directory, time_granularity)
        self.max_bytes = max(max_bytes, 1024)
        self.segment_bytes = segment_bytes or max(self.max_bytes // 4, 512)
        self._cond = threading.Condition()
        self._segments: list[list[int]] = []  # [start offset, size], oldest first
        self._fd: int | None = None
        self._cursor_fd: int | None = None
        self._last_byte = b"\n"
        self.cursor: str | None = None
        self.closed = False
        self._load()

    # -- state -----------------------------------------------------------------------------

    @property
    def end(self) -> int:
        """The offset the next appended byte gets (the log's total size ever written)."""
        if not self._segments:
            return 0
        start, size = self._segments[-1]
        return start + size

    @property
    def first_offset(self) -> int:
        """The oldest offset still stored; everything before it was discarded by rotation."""
        return self._segments[0][0] if self._segments else 0

    def _segment_path(self, start: int) -> Path:
        return self.directory / f"{start:016d}{_SEGMENT_SUFFIX}"

    def _load(self) -> None:
        for path in sorted(self.directory.glob(f"*{_SEGMENT_SUFFIX}")):
            try:
                start = int(path.name[: -len(_SEGMENT_SUFFIX)])
            except ValueError:
                continue
            self._segments.append([start, path.stat().st_size])
            self._times.load(start)
        cursor_path = self.directory / _CURSOR_FILE
        if cursor_path.exists():
            entry = _last_cursor_entry(cursor_path)
            if entry is None:
                self._truncate_to(self.first_offset)
            else:
                self.cursor, offset = entry
                self._truncate_to(offset)
        if self._segments and self._segments[-1][1]:
            path = self._segment_path(self._segments[-1][0])
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                self._last_byte = f.read(1)

    def _truncate_to(self, offset: int) -> None:
        """Drop bytes at or after `offset` (written after the last cursor reached the index)."""
        while self._segments and self._segments[-1][0] > offset and len(self._segments) > 1:
            start, _ = self._segments.pop()
            self._segment_path(start).unlink(missing_ok=True)
            self._times.remove(start)
        if self._segments:
            start, size = self._segments[-1]
            keep = max(0, offset - start)
            if keep < size:
                os.truncate(self._segment_path(start), keep)
                self._segments[-1][1] = keep
            self._times.drop_from(self.end, start)

    # -- writing ---------------------------------------------------------------------------

    def append(self, data: bytes, cursor: str | None = None) -> None:
        """Add output; with `cursor`, record that everything up to here came from that cursor."""
        with self._cond:
            if self.closed:
                return
            view = memoryview(data)
            now = self._clock()
            while view:
                # Big chunks are split across segments, so rotation keeps their recent end.
                if self._segments and self._segments[-1][1] >= self.segment_bytes:
                    self._new_segment()
                room = self.segment_bytes - (self._segments[-1][1] if self._segments else 0)
                if not self._segments:
                    self._segments.append([0, 0])
                self._times.note(self._segments[-1][0], self.end, now)
                self._write(bytes(view[:room]))
                view = view[room:]
            self._discard_old()
            # The cursor goes last: it vouches for every byte before it, marker included.
            if cursor is not None:
                self._write_cursor(cursor)
            self._cond.notify_all()

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            if not self._segments:
                self._segments.append([0, 0])
            path = self._segment_path(self._segments[-1][0])
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._segments[-1][1] += len(data)
        self._last_byte = data[-1:]

    def _write_cursor(self, cursor: str) -> None:
        self.cursor = cursor
        path = self.directory / _CURSOR_FILE
        if self._cursor_fd is None:
            self._cursor_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(self._cursor_fd, f"{cursor} {self.end}\n".encode())
        if os.fstat(self._cursor_fd).st_size > _CURSOR_FILE_MAX:
            # Only the last entry matters; rewrite the index so it cannot grow without bound.
            tmp = path.with_name(_CURSOR_FILE + ".tmp")
            tmp.write_bytes(f"{cursor} {self.end}\n".encode())
            os.replace(tmp, path)
            os.close(self._cursor_fd)
            self._cursor_fd = os.open(path, os.O_WRONLY | os.O_APPEND, 0o600)

    def _new_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._times.end_segment()
        self._segments.append([self.end, 0])

    def _discard_old(self) -> None:
        """Drop the oldest segments while over the cap, and say so in the log itself."""
        discarded = False
        while len(self._segments) > 1 and self._stored_bytes() > self.max_bytes:
            start, _ = self._segments.pop(0)
            self._segment_path(start).unlink(missing_ok=True)
            self._times.remove(start)
            discarded = True
        if discarded:
            # The marker gets the time of the append that caused it (the last entry's).
            self._times.drop_before(self.first_offset)
            lead = b"" if self._last_byte == b"\n" else b"\n"
            marker = (
                f"[dstack-plan agent] log limit of {self.max_bytes} bytes reached: "
                f"the first {self.first_offset} bytes were discarded\n"
            ).encode()
            self._write(lead + marker)

    def _stored_bytes(self) -> int:
        return sum(s for _, s in self._segments) + self._times.stored_bytes

    def close(self) -> None:
        """No more output will come: wake followers so they can finish."""
        with self._cond:
            self.closed = True
            self._times.close()
            for fd in (self._fd, self._cursor_fd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._cursor_fd = None
            self._cond.notify_all()

    # -- reading ---------------------------------------------------------------------------

    def read(self, offset: int, limit: int) -> tuple[int, bytes]:
        """Up to `limit` bytes from `offset` (or from `first_offset` if that was discarded).

        Returns the offset the data actually starts at, and the data.
        """
        with self._cond:
            position = max(offset, self.first_offset)
            chunks: list[bytes] = []
            remaining = limit
            for start, size in self._segments:
                if remaining <= 0 or position >= self.end:
                    break
                if not start <= position < start + size:
                    continue
                try:
                    with open(self._segment_path(start), "rb") as f:
                        f.seek(position - start)
                        chunk = f.read(min(remaining, start + size - position))
                except FileNotFoundError:
                    break  # the job was deleted under the reader
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
                position += len(chunk)
            return max(offset, self.first_offset), b"".join(chunks)

    def offset_at(self, since: float) -> int:
        """Where to start reading to get every byte appended at or after `since` (epoch
        seconds): bytes before it were all appended earlier, and at most `time_granularity`
        seconds of older output follow it. Bytes of unknown time count as recent."""
        with self._cond:
            return self._times.offset_at(since, self.first_offset, self.end)

    def times(self, start: int, end: int) -> list[tuple[int, float]]:
        """(offset, epoch) pairs over [start, end), the first at `start` when a known time
        covers it: each byte was appended at the time of the last pair at or before it (or
        up to `time_granularity` later)."""
        with self._cond:
            return self._times.pairs(start, end)

    def read_timed(self, offset: int, limit: int) -> tuple[int, bytes, list[tuple[int, float]]]:
        """`read`, with the `times` of what it returns."""
        with self._cond:
            start, data = self.read(offset, limit)
            return start, data, self._times.pairs(start, start + len(data))

    def wait(self, offset: int, timeout: float) -> bool:
        """Block until there is data past `offset` or the log is closed; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.end > offset or self.closed, timeout)


def _last_cursor_entry(path: Path) -> tuple[str, int] | None:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 4096))
        tail = f.read()
    # The last piece is either empty or a line cut short by a crash: never trust it.
    for line in reversed(tail.split(b"\n")[:-1]):
        parts = line.decode(errors="replace").split(" ")
        if len(parts) == 2 and parts[1].isdigit():
            return parts[0], int(parts[1])
    return None
