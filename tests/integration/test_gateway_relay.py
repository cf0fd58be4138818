"""The gateway's relay (`proxy/gateway_relay.py`) run for real as its own process, plain
HTTP on loopback: each request goes to the Unix socket its `Host` is claimed for in
`routes/` (another project's tunnel in `tunnels/`), anything else to the owner's
`upstream.sock`, and a claim whose socket nobody listens on gets `503`. The tunnels' ends
are small HTTP servers on Unix sockets in the test; no SSH, no TLS. Also `host_of` and
`socket_for` directly."""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dstack_plan.proxy import gateway_relay
from dstack_plan.proxy.gateway_relay import host_of, socket_for

pytestmark = pytest.mark.timeout(300)

RELAY = Path(gateway_relay.__file__)
READY_DEADLINE = 30.0
"""Seconds the relay may take to start listening (a safety net: passing never waits it out)."""
IO_TIMEOUT = 30.0
NO_WATCH = b"no dstack watch serves this gateway now"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the ends of the tunnels -----------------------------------------------------------------


@dataclass
class Upstream:
    """An HTTP server on a Unix socket answering `200` with `<name> <Host>`; it keeps every
    request it read, head and body as received."""

    name: str
    path: Path
    received: list[bytes] = field(default_factory=list)
    server: socketserver.ThreadingUnixStreamServer | None = None

    def start(self) -> None:
        upstream = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                conn.settimeout(IO_TIMEOUT)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head = data.split(b"\r\n\r\n", 1)[0]
                length, host = 0, ""
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                    if name.strip().lower() == b"host":
                        host = value.strip().decode()
                while len(data) < len(head) + 4 + length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                upstream.received.append(data)
                body = f"{upstream.name} {host}".encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )

        self.server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


# --- the relay -------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    body: bytes


@dataclass
class Gateway:
    """A running relay and its directory: `upstream.sock` (the owner's), `routes/`,
    `tunnels/ml.sock` (project ml's)."""

    dir: Path
    port: int
    owner: Upstream
    ml: Upstream

    @property
    def routes(self) -> Path:
        return self.dir / "routes"

    def claim(self, host: str, target: str) -> None:
        os.symlink(target, self.routes / host)

    def send(self, request: bytes) -> Response:
        """`request` sent as is to the relay; the response read to the end."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT) as s:
            s.sendall(request)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0]
        assert status_line.startswith(b"HTTP/1.1 "), data[:200]
        return Response(int(status_line.split()[1]), body)

    def get(self, host: str) -> Response:
        return self.send(f"GET / HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n".encode())


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path may be too long
    directory = Path(tempfile.mkdtemp(prefix="gwr-", dir="/tmp"))
    (directory / "routes").mkdir()
    (directory / "tunnels").mkdir()
    owner = Upstream("owner", directory / "upstream.sock")
    ml = Upstream("ml", directory / "tunnels" / "ml.sock")
    owner.start()
    ml.start()
    port = free_port()
    config = directory / "config.json"
    config.write_text(
        json.dumps(
            {
                "listen_host": "127.0.0.1",
                "listen_port": port,
                "socket": str(owner.path),
                "routes": str(directory / "routes"),
                "tunnels": str(directory / "tunnels"),
            }
        )
    )
    # as on a gateway's host: the one file uploaded beside its config, run from there (run
    # in dstack_plan/proxy/, its `token.py` would shadow the standard library's)
    shutil.copyfile(RELAY, directory / RELAY.name)
    relay = subprocess.Popen(
        [sys.executable, RELAY.name, config.name],
        cwd=directory,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + READY_DEADLINE
        while not (directory / "relay.ready").exists():
            if relay.poll() is not None:
                assert relay.stderr is not None
                pytest.fail(f"the relay exited {relay.returncode}: {relay.stderr.read()!r}")
            if time.monotonic() > deadline:
                pytest.fail("the relay did not write relay.ready")
            time.sleep(0.05)
        assert (directory / "relay.pid").read_text() == str(relay.pid)
        yield Gateway(directory, port, owner, ml)
    finally:
        relay.kill()
        relay.wait(timeout=60)
        if relay.stderr is not None:
            relay.stderr.close()
        owner.stop()
        ml.stop()
        shutil.rmtree(directory, ignore_errors=True)


# --- over the relay --------------------------------------------------------------------------


def test_a_name_nobody_claims_is_answered_by_the_owner(gateway: Gateway) -> None:
    response = gateway.get("web.example.test")
    assert response.status == 200
    assert response.body == b"owner web.example.test"


def test_a_claimed_name_is_answered_by_the_project_that_claimed_it(gateway: Gateway) -> None:
    gateway.claim("api.example.test", "ml.sock")
    response = gateway.get("api.example.test")
    assert (response.status, response.body) == (200, b"ml api.example.test")
    # the Host header is matched without case and without its port
    response = gateway.get("API.Example.Test:8080")
    assert (response.status, response.body) == (200, b"ml API.Example.Test:8080")
    # other names still go to the owner
    assert gateway.get("web.example.test").body == b"owner web.example.test"


def test_the_owners_own_claim_goes_to_the_owner(gateway: Gateway) -> None:
    gateway.claim("web.example.test", "../upstream.sock")
    assert gateway.get("web.example.test").body == b"owner web.example.test"


def test_the_claimed_upstream_receives_the_whole_request(gateway: Gateway) -> None:
    gateway.claim("api.example.test", "ml.sock")
    body = bytes(range(256)) * 800  # more than one read's worth, every byte value
    request = (
        b"POST /v1/predict?x=1 HTTP/1.1\r\nHost: api.example.test\r\n"
        b"Content-Type: application/octet-stream\r\nX-Trace: abc\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    response = gateway.send(request)
    assert (response.status, response.body) == (200, b"ml api.example.test")
    assert gateway.ml.received == [request]
    assert gateway.owner.received == []


@pytest.mark.parametrize("target", ["../../etc/x.sock", "/tmp/x.sock", "../routes/x.sock"])
def test_a_claim_pointing_outside_tunnels_goes_to_the_owner(gateway: Gateway, target: str) -> None:
    gateway.claim("api.example.test", target)
    response = gateway.get("api.example.test")
    assert (response.status, response.body) == (200, b"owner api.example.test")
    assert gateway.ml.received == []


def test_a_claim_whose_socket_nobody_listens_on_gets_503(gateway: Gateway) -> None:
    gateway.claim("api.example.test", "gone.sock")
    response = gateway.get("api.example.test")
    assert response.status == 503
    assert response.body.startswith(NO_WATCH)
    # the other names are served on
    assert gateway.get("web.example.test").status == 200


def test_no_owner_tunnel_gets_503(gateway: Gateway) -> None:
    gateway.owner.stop()
    (gateway.dir / "upstream.sock").unlink()
    response = gateway.get("web.example.test")
    assert response.status == 503
    assert response.body.startswith(NO_WATCH)


def test_a_host_with_a_slash_or_dots_goes_to_the_owner(gateway: Gateway) -> None:
    # claims a relay that followed the Host header into paths would reach
    (gateway.routes / "sub").mkdir()
    gateway.claim("sub/api", "ml.sock")
    gateway.claim("api..example.test", "ml.sock")
    os.symlink("tunnels/ml.sock", gateway.dir / "evil.test")
    for host in ("sub/api", "api..example.test", "../evil.test", ".."):
        response = gateway.get(host)
        assert (response.status, response.body) == (200, f"owner {host}".encode()), host
    assert gateway.ml.received == []


def test_a_request_without_a_host_goes_to_the_owner(gateway: Gateway) -> None:
    response = gateway.send(b"GET / HTTP/1.0\r\n\r\n")
    assert (response.status, response.body) == (200, b"owner ")


# --- host_of and socket_for ------------------------------------------------------------------


def head(host: bytes) -> bytes:
    return b"GET / HTTP/1.1\r\nAccept: */*\r\nHost: " + host + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"api.example.test", "api.example.test"),
        (b"API.Example.Test:8080", "api.example.test"),
        (b"  api.example.test  ", "api.example.test"),
        (b"api.example.test.", "api.example.test"),
        (b"10.0.0.1:80", "10.0.0.1"),
        (b"a/b.example.test", None),
        (b"../evil", None),
        (b"api..example.test", None),
        (b"..", None),
        (b"", None),
        (b"[::1]:8080", None),
        (b"under_score.test", None),
        (b"a" * 300, None),
    ],
)
def test_host_of(raw: bytes, expected: str | None) -> None:
    assert host_of(head(raw)) == expected


def test_host_of_reads_the_header_case_insensitively_and_only_from_the_head() -> None:
    assert host_of(b"GET / HTTP/1.1\r\nhOsT: a.test\r\n\r\n") == "a.test"
    assert host_of(b"GET / HTTP/1.1\r\nX: y\r\n\r\nHost: a.test\r\n\r\n") is None
    assert host_of(b"GET / HTTP/1.1\r\n\r\n") is None
    # the request line is not a header
    assert host_of(b"Host: a.test\r\n\r\n") is None


def test_host_of_drops_a_trailing_dot_before_a_port() -> None:
    assert host_of(head(b"api.example.test.:8080")) == "api.example.test"


def test_socket_for(tmp_path: Path) -> None:
    routes, tunnels = tmp_path / "routes", tmp_path / "tunnels"
    routes.mkdir()
    tunnels.mkdir()
    owner = str(tmp_path / "upstream.sock")
    config = {"socket": owner, "routes": str(routes), "tunnels": str(tunnels)}
    os.symlink("ml.sock", routes / "api.test")
    os.symlink("../upstream.sock", routes / "web.test")
    os.symlink("../../etc/x.sock", routes / "up.test")
    os.symlink("/tmp/x.sock", routes / "abs.test")
    os.symlink("sub/x.sock", routes / "deep.test")
    os.symlink("gone.sock", routes / "gone.test")
    assert socket_for("api.test", config) == str(tunnels / "ml.sock")
    assert socket_for("web.test", config) == owner
    assert socket_for("up.test", config) == owner
    assert socket_for("abs.test", config) == owner
    assert socket_for("deep.test", config) == owner
    # a claim is followed whether or not its socket is there (the relay then answers 503)
    assert socket_for("gone.test", config) == str(tunnels / "gone.sock")
    assert socket_for("nobody.test", config) == owner
    assert socket_for(None, config) == owner
    # a relay of a version before shared gateways: no routes, only the owner
    assert socket_for("api.test", {"socket": owner}) == owner
