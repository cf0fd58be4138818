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

`MaskedLog` is what writes a job's output into its store: it replaces each secret value of the
job (at least `MIN_SECRET_LENGTH` characters long, matched as its literal UTF-8 bytes) by
`(sensitive)` before a byte reaches the disk, so no reader of the log and no file of the data
dir ever holds a value. Masking is per output stream and streaming: a value split across
chunks is caught because the tail of a chunk that could begin a value is held back until the
next chunk (or the end) shows what it is; bytes of overlapping occurrences are all masked.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from dstack_plan.agent.logtimes import DEFAULT_GRANULARITY, TimeIndex

_SEGMENT_SUFFIX = ".log"
_CURSOR_FILE = "cursor.idx"
_CURSOR_FILE_MAX = 256 * 1024

MASK = b"(sensitive)"
"""What the stored log holds in place of each occurrence of a secret value."""
MIN_SECRET_LENGTH = 4
"""Secret values shorter than this (in characters) are not masked: as substrings they match
far too much (a value `1` would garble every number) and they protect nothing anyway."""


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


def maskable(values: Iterable[str]) -> tuple[bytes, ...]:
    """The values masking looks for: at least MIN_SECRET_LENGTH characters, as UTF-8 bytes,
    without duplicates, longest first."""
    found = {v.encode() for v in values if len(v) >= MIN_SECRET_LENGTH}
    return tuple(sorted(found, key=len, reverse=True))


class SecretMask:
    """Masks secret values in one stream of output that arrives chunk by chunk.

    `feed` returns the part of the stream that is final: every byte of every occurrence of a
    value in it is replaced (one `MASK` per run of overlapping occurrences). The end of a chunk
    that could be the start of a value (a proper prefix of one: fewer bytes than the longest
    value) is held back until the next chunk or `flush` shows whether it is.
    """

    def __init__(self, values: tuple[bytes, ...]):
        self._values = [(value, value[:1], len(value)) for value in values]
        self._pending = b""
        self._covered = 0
        """How many leading bytes of `_pending` belong to an occurrence whose MASK was already
        returned (one that went on past the held-back point): they are dropped, not shown."""

    @property
    def holding(self) -> bool:
        """Some bytes fed are neither returned nor dropped yet."""
        return bool(self._pending)

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        return self._mask(buf, self._hold_from(buf))

    def flush(self) -> bytes:
        """The stream ended: return what was held back, masked."""
        buf = self._pending
        return self._mask(buf, len(buf)) if buf else b""

    def _hold_from(self, buf: bytes) -> int:
        """The first position from which the rest of `buf` is a proper prefix of a value (an
        occurrence the next chunk may complete); len(buf) when there is none."""
        end = best = len(buf)
        view = None
        for value, head, size in self._values:
            at = buf.find(head, max(0, end - size + 1), best)
            while at != -1:
                if view is None:
                    view = memoryview(buf)
                if value.startswith(view[at:]):
                    best = at
                    break
                at = buf.find(head, at + 1, best)
        return best

    def _mask(self, buf: bytes, safe: int) -> bytes:
        """Return `buf[:safe]` masked, keep `buf[safe:]` for later. Occurrences that start
        before `safe` are masked whole, also past it (`_covered`); later ones are found again
        with the next chunk."""
        ranges: list[tuple[int, int]] = []
        for value, _, size in self._values:
            limit = safe + size - 1  # occurrences starting before `safe`
            at = buf.find(value, 0, limit)
            while at != -1:
                ranges.append((at, at + size))
                at = buf.find(value, at + 1, limit)
        if not ranges and not self._covered:  # the common case: nothing to mask
            self._pending = buf[safe:]
            return buf if safe == len(buf) else buf[:safe]
        ranges.sort()
        # runs of overlapping occurrences: [start, stop, MASK already returned]
        runs: list[list[int]] = [[0, self._covered, 1]] if self._covered else []
        for start, stop in ranges:
            if runs and start < runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], stop)
            else:
                runs.append([start, stop, 0])
        parts: list[bytes] = []
        done = 0  # buf[:done] is returned or dropped
        for start, stop, shown in runs:
            parts.append(buf[done:start])
            if not shown:
                parts.append(MASK)
            done = stop
        if done < safe:
            parts.append(buf[done:safe])
            self._covered = 0
        else:
            self._covered = done - safe
        self._pending = buf[safe:]
        return b"".join(parts)


class MaskedLog:
    """Writes a job's output into its `LogStore` with the job's secret values masked.

    Each output stream (stdout, stderr) is masked on its own, so a value split across two
    chunks of one stream is caught even when the other stream wrote in between. A cursor
    (`LogStore.append`) vouches for every byte captured before it, so it is stored only when
    no stream holds back a byte: a restarted agent then captures held-back bytes again.
    """

    def __init__(self, store: LogStore, values: Iterable[str] = ()):
        self.store = store
        self._lock = threading.Lock()
        self._values = maskable(values)
        self._streams: dict[str, SecretMask] = {}
        self._cursor: str | None = None

    @property
    def masked_values(self) -> int:
        """How many values are masked (those long enough)."""
        return len(self._values)

    def set_values(self, values: Iterable[str]) -> None:
        """Mask these values from now on (a re-adopted job's, read back from its container)."""
        with self._lock:
            self._flush()
            self._values = maskable(values)
            self._streams = {}

    def append(self, data: bytes, cursor: str | None = None, stream: str = "out") -> None:
        """Add output of `stream`, optionally with the cursor that covers it."""
        with self._lock:
            if not self._values:
                self.store.append(data, cursor)
                return
            mask = self._streams.get(stream)
            if mask is None:
                mask = self._streams[stream] = SecretMask(self._values)
            out = mask.feed(data)
            if cursor is not None:
                self._cursor = cursor
            vouched = None
            if self._cursor is not None and not any(m.holding for m in self._streams.values()):
                vouched, self._cursor = self._cursor, None
            if out or vouched is not None:
                self.store.append(out, vouched)

    def flush(self) -> None:
        """The output ended: store what was held back (nothing can complete it now)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        out = b"".join(mask.flush() for mask in self._streams.values())
        vouched, self._cursor = self._cursor, None
        if out or vouched is not None:
            self.store.append(out, vouched)
