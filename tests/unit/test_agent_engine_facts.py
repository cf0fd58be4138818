"""Host facts ask the docker engine its version at most every `PROBE_KEPT_SECONDS`: a watch
asks every host's facts each tick, and many agents asking one engine each time made every
answer wait on it. A failure is asked again sooner (`_RETRY_AFTER`)."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from dstack_plan.agent import dockerlib
from dstack_plan.agent.dockerlib import PROBE_KEPT_SECONDS, DockerEngine


class _Engine(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path) -> None:
        self.asked = 0
        self.version = "27.0.1"
        super().__init__(str(path), _Version)


class _Version(BaseHTTPRequestHandler):
    server: _Engine

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.server.asked += 1
        body = json.dumps({"Version": self.server.version, "ApiVersion": "1.46"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:  # a unix socket has no (host, port) peer
        return "engine"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Engine]:
    server = _Engine(tmp_path / "engine.sock")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'engine.sock'}")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv("DOCKER_CERT_PATH", raising=False)
    monkeypatch.setattr(dockerlib, "_sdk_installed", lambda: True)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_the_engine_is_asked_again_only_when_its_answer_is_old(
    engine: _Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(dockerlib.time, "monotonic", lambda: now[0])
    docker = DockerEngine()
    first = docker.facts()
    assert first == {"present": True, "version": "27.0.1", "api_version": "1.46", "error": None}
    first["version"] = "changed by a caller"  # each answer is the caller's own
    now[0] += PROBE_KEPT_SECONDS - 1
    assert docker.facts()["version"] == "27.0.1"
    assert engine.asked == 1
    engine.version = "28.0.0"  # upgraded meanwhile: seen once the answer is old
    now[0] += 2
    assert docker.facts()["version"] == "28.0.0"
    assert engine.asked == 2


def test_an_engine_that_went_away_is_reported_once_its_answer_is_old(
    engine: _Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(dockerlib.time, "monotonic", lambda: now[0])
    docker = DockerEngine()
    assert docker.facts()["present"] is True
    engine.shutdown()
    engine.server_close()
    (tmp_path / "engine.sock").unlink()
    now[0] += PROBE_KEPT_SECONDS + 1
    gone = docker.facts()
    assert gone["present"] is False and "no docker engine answers" in gone["error"]
