"""A small JSON-over-HTTP server on loopback that records every request, for fake cloud APIs.

`tests/infra/fake_gcp.py` and `tests/infra/fake_arm.py` subclass `RestApp`: they answer the
REST calls the real client libraries (google-cloud-compute, azure-mgmt-*) make, and tests
assert on what was sent. `RestServer` serves one app on 127.0.0.1, over plain HTTP or, given
a certificate, HTTPS (Azure's clients refuse bearer tokens over plain HTTP).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    """One request the server received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    """The JSON body, decoded (None when empty; the raw text when not JSON)."""
    raw: bytes = b""
    """The body's bytes as sent (for apps that pass bodies through, such as a proxy)."""
    query_string: str = ""
    """The query as sent (`query` drops blank values and reorders)."""


@dataclass
class Reply:
    """What the server sends back: `body` as JSON, or `raw` bytes as they are."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    """Sent instead of `body` when set, with `content_type` (unless `headers` name one)."""
    content_type: str = "application/octet-stream"


class RestApp:
    """What a fake API answers. Subclasses implement `handle`; `lock` guards their state
    (requests come in on several threads)."""

    handle_under_lock = True
    """Whether the server holds `lock` while `handle` runs. An app that waits inside `handle`
    (e.g. forwarding to another server) sets False and takes `lock` itself."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.lock = threading.RLock()
        self.base_url = ""
        """Set by the server once it listens: `http://127.0.0.1:PORT`."""
        self.errors: list[str] = []
        """Exceptions `handle` raised (each answered 500), for tests to assert none."""

    def handle(self, request: Request) -> Reply:
        raise NotImplementedError

    def sent(self, method: str, path_part: str = "") -> list[Request]:
        """The requests of `method` whose path contains `path_part`, oldest first."""
        with self.lock:
            return [r for r in self.requests if r.method == method and path_part in r.path]


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost and its key, made with openssl."""
    crt, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(crt), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return crt, key


class RestServer:
    """Serves `app` on 127.0.0.1 in a background thread until `stop`."""

    def __init__(self, app: RestApp, *, tls: tuple[Path, Path] | None = None):
        self.app = app
        handler = _handler_for(app)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
            scheme = "https"
        port = self._httpd.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{port}"
        app.base_url = self.url
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler_for(app: RestApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out in two writes: with Nagle on, the client's delayed ACK
        # holds the body back ~40 ms on every request
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw_bytes = self.rfile.read(length) if length else b""
            # bodies a proxying app passes through may be binary: the text form is lossy
            raw = raw_bytes.decode(errors="replace")
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw
            url = urlsplit(self.path)
            request = Request(
                self.command,
                url.path,
                parse_qs(url.query),
                dict(self.headers.items()),
                body,
                raw_bytes,
                url.query,
            )
            with app.lock:
                app.requests.append(request)
            reply = self._answer(request)
            headers = dict(reply.headers)
            has_type = any(k.lower() == "content-type" for k in headers)
            if reply.raw is not None:
                data = reply.raw
                if not has_type:
                    headers["Content-Type"] = reply.content_type
            else:
                data = b"" if reply.body is None else json.dumps(reply.body).encode()
                if data and not has_type:
                    headers["Content-Type"] = "application/json"
            self.send_response(reply.status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _answer(self, request: Request) -> Reply:
            try:
                if not app.handle_under_lock:
                    return app.handle(request)
                with app.lock:
                    return app.handle(request)
            except Exception as e:  # noqa: BLE001 - a fake's bug answers 500, and is kept
                message = f"{request.method} {request.path}: {e!r}"
                with app.lock:
                    app.errors.append(message)
                return Reply(500, {"error": message})

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

    return Handler
