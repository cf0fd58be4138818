"""TCP throughput probes between hosts: one agent listens, another sends to it for about 1 s.

The controller asks the receiving host's agent to `listen` (a socket on the host's
fleet-internal address, a free port, a one-shot token), then the sending host's agent to `send`
there, then the receiver for what arrived (`result`). Both sides measure bytes per second: the
sender from its first byte until the receiver closed after reading the last one, the receiver
from the first byte to the end. Everything is bounded: seconds, bytes, how long a listener waits
for its sender, how many listen at once. Standard library only (the agent runs on bare python3).
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import threading
import time
import uuid
from typing import Any

DEFAULT_SECONDS = 1.0
MAX_SECONDS = 5.0
DEFAULT_MAX_BYTES = 2 * 1024**3
MAX_BYTES = 16 * 1024**3
ACCEPT_SECONDS = 20.0
"""How long a listener waits for the sender holding its token; then it closes, failed."""
IO_TIMEOUT = 10.0
TOKEN_TIMEOUT = 3.0
CHUNK = 256 * 1024
TOKEN_BYTES = 32  # hex characters on the wire
MAX_LISTENERS = 4
KEEP_RESULTS = 32
RESULT_WAIT_MAX = 60


class ProbeError(Exception):
    """A probe request that cannot be served; the server answers `status` with the message."""

    def __init__(self, status: int, message: str, field: str | None = None, code: str = "probe"):
        super().__init__(message)
        self.status = status
        self.field = field
        self.code = code


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ProbeError(400, f"{name}: must be a number {low:g}..{high:g}, got {value!r}", name)
    return float(value)


def _bind(address: str | None) -> tuple[socket.socket, bool]:
    """A listening socket on `address` (a name or IP of this host), or on every address when
    none is given or it is not one of this host's (behind NAT, say): (socket, bound to all)."""
    if address:
        try:
            infos = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)
        except OSError:
            infos = []
        for family, kind, proto, _, where in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.bind(where)
                sock.listen(4)
                return sock, False
            except OSError:
                sock.close()
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True), True
    return socket.create_server(("", 0)), True


class Listener:
    """One receiving end: waits for the sender with the token, reads until it closes."""

    def __init__(self, sock: socket.socket, bound_all: bool, max_bytes: int):
        self.id = uuid.uuid4().hex
        self.token = secrets.token_hex(TOKEN_BYTES // 2)
        self.sock = sock
        self.bound_all = bound_all
        self.max_bytes = max_bytes
        self.status = "listening"
        self.bytes = 0
        self.seconds = 0.0
        self.error: str | None = None
        self.peer: str | None = None
        self.rejected = 0
        """Connections that did not present the token (closed at once)."""
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="bandwidth-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def info(self) -> dict[str, Any]:
        """What the controller hands to the sender (with the token) to connect here."""
        host, port = self.sock.getsockname()[:2]
        return {
            "id": self.id,
            "address": host,
            "port": port,
            "bound_all": self.bound_all,
            "token": self.token,
            "accept_seconds": ACCEPT_SECONDS,
        }

    def result(self) -> dict[str, Any]:
        """What arrived so far, and the rate once done."""
        rate = self.bytes / self.seconds if self.status == "done" and self.seconds > 0 else None
        return {
            "id": self.id,
            "status": self.status,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "bytes_per_second": rate,
            "error": self.error,
            "peer": self.peer,
            "rejected": self.rejected,
        }

    def _serve(self) -> None:
        deadline = time.monotonic() + ACCEPT_SECONDS
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OSError(f"no sender presented the token within {ACCEPT_SECONDS:g}s")
                self.sock.settimeout(remaining)
                try:
                    conn, peer = self.sock.accept()
                except socket.timeout:  # noqa: UP041 - not TimeoutError on python 3.9
                    continue
                with conn:
                    conn.settimeout(TOKEN_TIMEOUT)
                    try:
                        presented = _read_exact(conn, TOKEN_BYTES)
                    except OSError:
                        presented = b""
                    if not hmac.compare_digest(presented, self.token.encode()):
                        self.rejected += 1  # a stranger (or a port scan): not our sender
                        continue
                    conn.settimeout(IO_TIMEOUT)
                    self.sock.close()  # one-shot: nobody else gets in
                    self.peer = str(peer[0])
                    self.status = "receiving"
                    self._receive(conn)
                    self.status = "done"
                    return
        except OSError as e:
            self.status = "failed"
            self.error = str(e) or type(e).__name__
        finally:
            self.sock.close()
            self.done.set()

    def _receive(self, conn: socket.socket) -> None:
        buffer = bytearray(CHUNK)
        started: float | None = None
        hard_stop = time.monotonic() + MAX_SECONDS + IO_TIMEOUT
        while True:
            n = conn.recv_into(buffer)
            now = time.monotonic()
            if not n:
                break
            if started is None:
                started = now
            self.bytes += n
            self.seconds = now - started
            if self.bytes > self.max_bytes or now > hard_stop:
                raise OSError(f"the sender went past the bounds ({self.bytes} bytes)")


def _read_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class Probes:
    """The probes of one agent: its listeners by id (the last KEEP_RESULTS kept)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[str, Listener] = {}

    def listen(self, body: dict[str, Any]) -> dict[str, Any]:
        """Open a listener: body `{address, max_bytes}`; answers where and with what token."""
        if not isinstance(body, dict) or set(body) - {"address", "max_bytes"}:
            raise ProbeError(400, "body: expected {address, max_bytes}", "body")
        address = body.get("address")
        if address is not None and not isinstance(address, str):
            raise ProbeError(400, "address: must be a string", "address")
        max_bytes = int(_number(body, "max_bytes", DEFAULT_MAX_BYTES, 1, MAX_BYTES))
        with self._lock:
            active = [x for x in self._listeners.values() if not x.done.is_set()]
            if len(active) >= MAX_LISTENERS:
                raise ProbeError(429, f"{MAX_LISTENERS} probes already listen here", None, "busy")
            try:
                sock, bound_all = _bind(address)
            except OSError as e:
                raise ProbeError(500, f"cannot listen for a probe: {e}") from None
            listener = Listener(sock, bound_all, max_bytes)
            self._listeners[listener.id] = listener
            finished = [k for k, x in self._listeners.items() if x.done.is_set()]
            for key in finished[: max(0, len(self._listeners) - KEEP_RESULTS)]:
                del self._listeners[key]
        listener.start()
        return listener.info()

    def result(self, probe_id: str, wait: float) -> dict[str, Any]:
        """The listener's measure, waiting up to `wait` seconds for it to finish."""
        with self._lock:
            listener = self._listeners.get(probe_id)
        if listener is None:
            raise ProbeError(404, f"no probe {probe_id}", "id", "no_probe")
        listener.done.wait(min(max(wait, 0.0), RESULT_WAIT_MAX))
        return listener.result()


def send(body: dict[str, Any]) -> dict[str, Any]:
    """Connect to a listener (body `{address, port, token, seconds, max_bytes}`), send for
    `seconds` or `max_bytes`, whichever comes first, and wait until the receiver has read it
    all: `{bytes, seconds, bytes_per_second}`. Raises ProbeError (502) when it fails."""
    allowed = {"address", "port", "token", "seconds", "max_bytes"}
    if not isinstance(body, dict) or set(body) - allowed:
        raise ProbeError(400, "body: expected {address, port, token, seconds, max_bytes}", "body")
    address, token = body.get("address"), body.get("token")
    if not isinstance(address, str) or not address:
        raise ProbeError(400, "address: required", "address")
    if not isinstance(token, str) or len(token) != TOKEN_BYTES:
        raise ProbeError(400, f"token: must be {TOKEN_BYTES} characters", "token")
    port = int(_number(body, "port", 0, 1, 65535))
    seconds = _number(body, "seconds", DEFAULT_SECONDS, 0.01, MAX_SECONDS)
    max_bytes = int(_number(body, "max_bytes", DEFAULT_MAX_BYTES, 1, MAX_BYTES))
    try:
        conn = socket.create_connection((address, port), timeout=IO_TIMEOUT)
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        message = f"cannot connect to {address}:{port}: {why}"
        raise ProbeError(502, message, None, "unreachable") from None
    sent = 0
    try:
        with conn:
            conn.settimeout(IO_TIMEOUT + seconds)
            conn.sendall(token.encode())
            data = memoryview(os.urandom(CHUNK))  # incompressible, for any link in between
            started = time.monotonic()
            until = started + seconds
            while sent < max_bytes:
                n = min(CHUNK, max_bytes - sent)
                conn.sendall(data[:n])
                sent += n
                if time.monotonic() >= until:
                    break
            conn.shutdown(socket.SHUT_WR)
            # the receiver closes once it has read everything: then all of it has arrived
            while conn.recv(4096):
                pass
            elapsed = time.monotonic() - started
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        message = f"sending to {address}:{port} failed after {sent} bytes: {why}"
        raise ProbeError(502, message, None, "probe_failed") from None
    rate = sent / elapsed if elapsed > 0 else None
    return {"bytes": sent, "seconds": round(elapsed, 6), "bytes_per_second": rate}
