"""Log line formats shared by the agent and the CLI: text for people, JSON for collectors.

Standard library only, so the agent can use it on a bare host.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("event", "address", "job_id", "host", "resource_type", "span_id")
"""What a log call may pass in `extra=` (the logging convention): the run's address, the
job, the host, what kind of thing the line is about (`run`, `job`, `host`, `gpu`, `fleet`),
the run's span id and a snake_case event name."""
KEYS = ("ts", "level", *CONTEXT_FIELDS, "message", "logger")
"""Every JSON line has all of these, in this order (null when unknown); `dstack logs --json`
writes the same keys."""


def rfc3339(epoch: float) -> str:
    """`epoch` as RFC 3339 UTC with milliseconds: `2026-12-01T14:49:30.123Z`."""
    moment = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def log_line(**fields: object) -> dict[str, object]:
    """A JSON line's object: every key of KEYS (None unless given) in order, then any
    other fields given."""
    entry: dict[str, object] = {key: fields.get(key) for key in KEYS}
    entry.update({k: v for k, v in fields.items() if k not in entry})
    return entry


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the keys of KEYS: the record's time (`ts`), level,
    message and logger, and the context its `extra=` gave (null when it gave none); an
    exception travels in `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        context = {name: getattr(record, name, None) for name in CONTEXT_FIELDS}
        entry = log_line(
            ts=rfc3339(record.created),
            level=record.levelname.lower(),
            message=record.getMessage(),
            logger=record.name,
            **context,
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str, log_format: str) -> None:
    """Send the process's log records to stderr at `level` (one of LEVELS), as text or JSON.

    Raises ValueError, naming the choices, for an unknown level or format.
    """
    if level.lower() not in LEVELS or log_format not in FORMATS:
        raise ValueError(
            f"got log level {level!r} and format {log_format!r}: the level is one of "
            f"{', '.join(LEVELS)}, the format one of {', '.join(FORMATS)}"
        )
    handler = logging.StreamHandler()  # stderr
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
