"""The docker SDK, imported lazily: a host without the SDK or an engine still runs the agent.

Importing the SDK (requests, urllib3...) costs a host more CPU than the rest of the agent's
start, so the agent starts without it: `client()` imports and connects on the first request
that needs containers (a docker job, re-adopting one after a restart). Host facts ask the
engine's version over its socket with the standard library instead (`probe`), falling back to
the SDK only for an engine the probe cannot reach (TLS, ssh://). So `present` says an engine
answers; an SDK that does not import on this python (too new for it) is reported from the first
request that needed it on (that request fails, saying why).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import logging
import os
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

API_TIMEOUT = 60
PROBE_TIMEOUT = 5.0
DEFAULT_HOST = "unix:///var/run/docker.sock"
_RETRY_AFTER = 5.0
PROBE_KEPT_SECONDS = 30.0
"""How long the engine's answer to `probe` stands for host facts (as GPUs are detected at most
every 30 s): a watch asks every host's facts each tick, and 100 agents asking one engine
each time made each answer wait up to half a second."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (the engine's usual address)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _probe_connection(environ: dict[str, str]) -> http.client.HTTPConnection | None:
    """A connection to the engine the SDK's `from_env` would use, or None when only the SDK
    can reach it (TLS settings, an ssh:// or npipe:// address)."""
    if environ.get("DOCKER_TLS_VERIFY") or environ.get("DOCKER_CERT_PATH"):
        return None
    address = urlsplit(environ.get("DOCKER_HOST") or DEFAULT_HOST)
    if address.scheme == "unix":
        return _UnixConnection(address.path, PROBE_TIMEOUT)
    if address.scheme in ("tcp", "http") and address.hostname:
        return http.client.HTTPConnection(
            address.hostname, address.port or 2375, timeout=PROBE_TIMEOUT
        )
    return None


def probe(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The engine's `/version` (stdlib only); None when only the SDK can ask. Raises OSError
    or ValueError when the engine does not answer, or not as an engine."""
    conn = _probe_connection(dict(os.environ if environ is None else environ))
    if conn is None:
        return None
    try:
        conn.request("GET", "/version")
        response = conn.getresponse()
        body = response.read()
    except http.client.HTTPException as e:
        raise OSError(f"no docker engine answers: {e}") from e
    finally:
        conn.close()
    if response.status != 200:
        raise OSError(f"the docker engine answered {response.status} {response.reason}")
    version = json.loads(body)
    if not isinstance(version, dict):
        raise ValueError("the docker engine's /version is not an object")
    return version


class DockerEngine:
    """One shared docker client, (re)connected on demand, with the reason when there is none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._version: dict[str, Any] = {}
        self.error: str | None = None
        self._last_attempt = 0.0
        self._sdk_error: str | None = None
        """Why the SDK does not import here (then no container runs, whatever the engine)."""
        self._probe_failed: tuple[float, str] | None = None
        self._probed: tuple[float, dict[str, Any] | None] | None = None
        """(when, the facts `_probe` made of the engine's answer)."""

    @property
    def connected(self) -> bool:
        """The SDK is imported and its client connected."""
        return self._client is not None

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
                self.error = self._sdk_error = f"docker SDK not usable: {type(e).__name__}: {e}"
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
        """{present, version, api_version, error} for /host, without importing the SDK while
        no request has needed it (see module doc)."""
        # no SDK at all (a bundle built without it): `client` says so, importing nothing
        if self._client is None and self._sdk_error is None and _sdk_installed():
            probed = self._probe()
            if probed is not None:
                return probed
        client = self.client()
        if client is None:
            return _absent(self.error)
        return {
            "present": True,
            "version": self._version.get("Version"),
            "api_version": client.api.api_version,
            "error": None,
        }

    def _probe(self) -> dict[str, Any] | None:
        """Facts from `probe`, or None when only the SDK can tell. A failure is remembered for
        a few seconds, as `client` does; an answer for `PROBE_KEPT_SECONDS`."""
        with self._lock:
            now = time.monotonic()
            failed = self._probe_failed
            if failed is not None and now - failed[0] < _RETRY_AFTER:
                return _absent(failed[1])
            probed = self._probed
            if probed is None or now - probed[0] >= PROBE_KEPT_SECONDS:
                try:
                    version = probe()
                except (OSError, ValueError) as e:
                    self._probed = None
                    self._probe_failed = (now, f"no docker engine answers: {e}")
                    return _absent(self._probe_failed[1])
                self._probe_failed = None
                probed = self._probed = (now, None if version is None else _present(version))
            return None if probed[1] is None else dict(probed[1])  # each caller its own


def _sdk_installed() -> bool:
    """The docker SDK can be found (not imported: whether it imports on this python, the
    first request that needs it tells)."""
    try:
        return importlib.util.find_spec("docker") is not None
    except (ImportError, ValueError):
        return False


def _present(version: dict[str, Any]) -> dict[str, Any]:
    return {
        "present": True,
        "version": version.get("Version"),
        "api_version": version.get("ApiVersion"),
        "error": None,
    }


def _absent(error: str | None) -> dict[str, Any]:
    return {"present": False, "version": None, "api_version": None, "error": error}
