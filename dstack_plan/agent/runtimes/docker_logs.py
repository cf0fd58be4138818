"""Where a container's output capture stands, so a restarted agent resumes it exactly.

Live output comes from an attach made before the container starts (like `docker run`), which
carries no timestamps. What identifies a position is therefore how many bytes of each stream
were captured: the engine's own log (json-file) holds the same bytes per stream, so reading a
stream from its start and dropping that many bytes continues it with nothing lost or repeated.
That holds while the engine has not rotated its copy; past its size cap the resume falls back
to wall-clock time and says so in the log.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

_JSON_LINE_OVERHEAD = 100
"""Bytes json-file adds per line ({"log":...,"stream":...,"time":...})."""


class StreamCursor:
    """Bytes captured from stdout and stderr, lines, and the wall time of the last capture."""

    def __init__(self, encoded: str | None = None):
        self.out = self.err = self.lines = 0
        self.wall = 0.0
        if encoded:
            out, err, lines, wall = encoded.split(":")
            self.out, self.err, self.lines = int(out), int(err), int(lines)
            self.wall = int(wall) / 1000

    def add(self, stream: str, data: bytes) -> str:
        """Count `data` as captured from `stream` ("out" or "err"); returns the new cursor."""
        if stream == "out":
            self.out += len(data)
        else:
            self.err += len(data)
        self.lines += data.count(b"\n")
        self.wall = time.time()
        return self.encode()

    def encode(self) -> str:
        return f"{self.out}:{self.err}:{self.lines}:{int(self.wall * 1000)}"

    def engine_log_estimate(self) -> int:
        """About how big the engine's json-file log of what was captured is."""
        return int((self.out + self.err) * 1.2) + self.lines * _JSON_LINE_OVERHEAD


def skip_bytes(chunks: Iterable[bytes], count: int) -> Iterator[bytes]:
    """The chunks with their first `count` bytes left out."""
    for chunk in chunks:
        if count >= len(chunk):
            count -= len(chunk)
            continue
        if count:
            chunk = chunk[count:]
            count = 0
        yield chunk
