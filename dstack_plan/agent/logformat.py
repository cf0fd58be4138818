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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


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
