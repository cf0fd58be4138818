"""A fake pod's logs (tests/infra/fake_kube_pods.py): one file per run of its container,
with each line's arrival time, so the log endpoint can answer `sinceSeconds`, `tailLines`,
`timestamps` and `limitBytes`.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.infra.fake_kube_store import rfc3339_nano


@dataclass
class LogRun:
    """The log of one run of the container: the file and when each line began."""

    path: Path
    line_starts: list[tuple[int, float]] = field(default_factory=list)


def read_log(proc: subprocess.Popen[bytes], run: LogRun) -> None:
    """Copy the process's output to the run's file until it closes (a reader thread)."""
    assert proc.stdout is not None
    fd, position, at_line_start = proc.stdout.fileno(), 0, True
    with open(run.path, "ab") as out:
        while chunk := os.read(fd, 65536):
            out.write(chunk)
            out.flush()
            now = time.time()
            # the file first, then the line starts: a reader never sees a start past the end
            starts = [position] if at_line_start else []
            starts += [
                position + m.end() for m in re.finditer(b"\n", chunk) if m.end() < len(chunk)
            ]
            run.line_starts.extend((s, now) for s in starts)
            at_line_start = chunk.endswith(b"\n")
            position += len(chunk)
    proc.stdout.close()


def render_log(run: LogRun, arg: Callable[[str], str | None]) -> bytes:
    """The run's log as the query (`arg`) asks for it."""
    starts = list(run.line_starts)
    data = run.path.read_bytes()
    lines = [
        (when, data[start : starts[i + 1][0] if i + 1 < len(starts) else len(data)])
        for i, (start, when) in enumerate(starts)
    ]
    if (since := arg("sinceSeconds")) is not None:
        lines = [(w, line) for w, line in lines if w >= time.time() - int(since)]
    if (tail := arg("tailLines")) is not None:
        lines = lines[-int(tail) :] if int(tail) > 0 else []
    stamped = arg("timestamps") == "true"
    out = b"".join(
        (rfc3339_nano(w).encode() + b" " if stamped else b"") + line for w, line in lines
    )
    if (limit := arg("limitBytes")) is not None:
        out = out[: int(limit)]
    return out
