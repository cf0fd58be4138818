"""Docker log frames with timestamps, and the cursor that resumes them without duplicates.

With `timestamps=True` every frame starts with an RFC 3339 nano timestamp. The cursor is
`<ns>:<n>`: the timestamp of the last frame kept and how many frames with exactly that
timestamp were kept, so a re-read from slightly earlier drops precisely what was already kept.
"""

from __future__ import annotations

import calendar

RESUME_SLACK_NS = 1_000_000
"""Ask docker for logs a little before the cursor: its `since` is a float and may round up."""


def parse_timestamp_ns(text: bytes) -> int | None:
    """Nanoseconds since the epoch of `2024-05-01T12:00:00.123456789Z`, or None."""
    try:
        s = text.decode("ascii")
        if not s.endswith("Z"):
            return None
        date, _, clock = s[:-1].partition("T")
        year, month, day = (int(x) for x in date.split("-"))
        hms, _, fraction = clock.partition(".")
        hour, minute, second = (int(x) for x in hms.split(":"))
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
        return seconds * 1_000_000_000 + int((fraction or "0").ljust(9, "0")[:9])
    except (ValueError, UnicodeDecodeError):
        return None


class FrameFilter:
    """Splits timestamped frames, skips those at or before the cursor, advances the cursor."""

    def __init__(self, cursor: str | None = None):
        self.ts_ns = -1
        self.count = 0
        if cursor:
            ts, _, count = cursor.partition(":")
            self.ts_ns, self.count = int(ts), int(count or 0)
        self.rewind()

    def rewind(self) -> None:
        """A new read from `since()` begins: drop frames up to the cursor again."""
        self._skip_ts = self.ts_ns
        self._skip_left = self.count

    @property
    def cursor(self) -> str | None:
        return None if self.ts_ns < 0 else f"{self.ts_ns}:{self.count}"

    def since(self) -> float | None:
        """The `since` argument for docker's logs call, or None to read from the start."""
        if self.ts_ns < 0:
            return None
        return max(self.ts_ns - RESUME_SLACK_NS, 1) / 1e9

    def accept(self, frame: bytes) -> tuple[bytes | None, str | None]:
        """(payload to keep or None, cursor after it)."""
        stamp, sep, payload = frame.partition(b" ")
        ts = parse_timestamp_ns(stamp) if sep else None
        if ts is None:
            return frame, self.cursor  # not a timestamped frame: keep it whole
        if ts < self._skip_ts:
            return None, self.cursor
        if ts == self._skip_ts and self._skip_left > 0:
            self._skip_left -= 1
            return None, self.cursor
        if ts == self.ts_ns:
            self.count += 1
        else:
            self.ts_ns, self.count = ts, 1
        return payload, self.cursor
