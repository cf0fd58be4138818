"""The docker SDK, imported lazily: a host without the SDK or an engine still runs the agent."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

API_TIMEOUT = 60
_RETRY_AFTER = 5.0


class DockerEngine:
    """One shared docker client, (re)connected on demand, with the reason when there is none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._version: dict[str, Any] = {}
        self.error: str | None = None
        self._last_attempt = 0.0

    def client(self) -> Any:
        """A connected `docker.DockerClient`, or None (see `error`) when no engine answers."""
        with self._lock:
            if self._client is not None:
                return self._client
            # Without this, every request on an engine-less host would pay a connect timeout.
            if time.monotonic() - self._last_attempt < _RETRY_AFTER and self._last_attempt:
                return None
            self._last_attempt = time.monotonic()
            try:
                import docker  # noqa: PLC0415 - optional, and slow to import
            except Exception as e:  # an SDK too new for this python raises SyntaxError etc.
                self.error = f"docker SDK not usable: {type(e).__name__}: {e}"
                return None
            try:
                client = docker.from_env(timeout=API_TIMEOUT)
                self._version = client.version()
            except Exception as e:
                self.error = f"no docker engine answers: {e}"
                return None
            self._client = client
            self.error = None
            log.info(
                "docker engine %s (API %s)", self._version.get("Version"), client.api.api_version
            )
            return client

    def facts(self) -> dict[str, Any]:
        """{present, version, api_version, error} for /host."""
        client = self.client()
        if client is None:
            return {"present": False, "version": None, "api_version": None, "error": self.error}
        return {
            "present": True,
            "version": self._version.get("Version"),
            "api_version": client.api.api_version,
            "error": None,
        }
