"""The coarse time index of a job's log: when each stretch of bytes was appended.

Each log segment `<start>.log` has an index beside it, `<start>.tix`: lines `offset epoch`, one
at the segment's first byte and then one at the first append at least `granularity` seconds
after the previous entry. So the bytes from one entry to the next were all appended within
`granularity` of the entry's time, which is what `offset_at` and `pairs` rely on. Times never go
backwards (a clock stepping back is clamped to the last time). A segment without an index
(written by an agent older than it) has bytes of unknown time.

Standard library only (the agent runs on a bare host); not thread-safe on its own: `LogStore`
calls it under its lock.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

SUFFIX = ".tix"
DEFAULT_GRANULARITY = 1.0


class TimeIndex:
    """The time entries of every retained segment of one log, oldest first."""

    def __init__(self, directory: Path, granularity: float = DEFAULT_GRANULARITY) -> None:
        self.directory = directory
        self.granularity = granularity
        self._offsets: list[int] = []
        self._times: list[float] = []
        self._bytes: dict[int, int] = {}  # segment start -> size of its index file
        self._fd: int | None = None  # the index of the segment being written

    def path(self, start: int) -> Path:
        return self.directory / f"{start:016d}{SUFFIX}"

    @property
    def stored_bytes(self) -> int:
        """What the index files take on disk (they count towards the log's cap)."""
        return sum(self._bytes.values())

    def load(self, start: int) -> None:
        """Read the index of segment `start` (segments in order); a torn last line is cut."""
        path = self.path(start)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return  # written by an agent older than the time index: times unknown
        whole = raw[: raw.rfind(b"\n") + 1]
        if len(whole) < len(raw):
            os.truncate(path, len(whole))  # a line cut short by a crash
        self._bytes[start] = len(whole)
        for line in whole.split(b"\n")[:-1]:
            parts = line.split(b" ")
            try:
                offset, at = int(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue
            if self._offsets and (offset <= self._offsets[-1] or at < self._times[-1]):
                continue
            self._offsets.append(offset)
            self._times.append(at)

    def note(self, segment: int, offset: int, now: float) -> None:
        """Bytes are about to be appended at `offset` of segment `segment`, at `now`: add an
        entry when the segment has none yet or the last one is `granularity` old."""
        last = self._times[-1] if self._times else None
        fresh_segment = not self._offsets or self._offsets[-1] < segment
        if not fresh_segment and last is not None and now < last + self.granularity:
            return
        at = now if last is None else max(now, last)
        self._offsets.append(offset)
        self._times.append(at)
        if self._fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            self._fd = os.open(self.path(segment), flags, 0o600)
        line = _line(offset, at).encode()
        os.write(self._fd, line)
        self._bytes[segment] = self._bytes.get(segment, 0) + len(line)

    def end_segment(self) -> None:
        """The segment being written is full: the next `note` opens the next one's index."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self, start: int) -> None:
        """Segment `start` is gone: so is its index file (entries: see `drop_before`)."""
        self.path(start).unlink(missing_ok=True)
        self._bytes.pop(start, None)

    def drop_before(self, first_offset: int) -> None:
        """Forget entries of bytes before `first_offset` (discarded by rotation)."""
        keep = bisect.bisect_left(self._offsets, first_offset)
        del self._offsets[:keep], self._times[:keep]

    def drop_from(self, end: int, segment: int) -> None:
        """Bytes from `end` on were dropped (recovery): forget their entries, rewriting the
        index of `segment`, the last one kept."""
        cut = bisect.bisect_left(self._offsets, end)
        if cut == len(self._offsets):
            return
        del self._offsets[cut:], self._times[cut:]
        first = bisect.bisect_left(self._offsets, segment)
        text = "".join(
            _line(o, t) for o, t in zip(self._offsets[first:], self._times[first:], strict=True)
        )
        self.path(segment).write_text(text)
        self._bytes[segment] = len(text)

    def offset_at(self, since: float, first_offset: int, end: int) -> int:
        """Where a reader of everything appended at or after `since` starts (see LogStore)."""
        # Entry j's bytes were appended in [t_j, t_j + granularity): the first that may be
        # at or after `since` is the first with t_j > since - granularity.
        j = bisect.bisect_right(self._times, since - self.granularity)
        if j == 0:
            return first_offset  # includes any bytes of unknown time
        if j == len(self._offsets):
            return end
        return max(self._offsets[j], first_offset)

    def pairs(self, start: int, end: int) -> list[tuple[int, float]]:
        """The entries over [start, end), the first moved to `start` when one covers it."""
        i = bisect.bisect_right(self._offsets, start)
        pairs = [(start, self._times[i - 1])] if i > 0 else []
        while i < len(self._offsets) and self._offsets[i] < end:
            if self._offsets[i] > start or not pairs:
                pairs.append((self._offsets[i], self._times[i]))
            i += 1
        return pairs

    def close(self) -> None:
        self.end_segment()


def _line(offset: int, at: float) -> str:
    return f"{offset} {at:.3f}\n"
