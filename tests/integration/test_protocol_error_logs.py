"""Malformed requests that carry a bearer token (bare LF or bare CR line endings, a header
line without a colon, a bad Content-Length, a bad method) sent to each HTTP server: the UI
and API, the service proxy (both in this process: their logs through caplog) and a real agent
process (its log file). No server logs the token, and they say so in at most one brief line
per interval, however many arrive. Also: a replica's malformed answer does not make the proxy
log the client's request headers."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

import pytest

from dstack_plan.proxy import ServiceProxy, ServiceRoute, Upstream
from tests.infra.agent_process import AgentProcess
from tests.integration.test_loopback_host_check import exchange, get, ui
from tests.integration.test_proxy import FAST_PROBE, wait_healthy

pytestmark = pytest.mark.timeout(60)

ROUNDS = 5


def malformed(path: str, token: str) -> list[bytes]:
    """Bad requests to `path`, each with `Authorization: Bearer <token>`."""
    auth = f"Authorization: Bearer {token}"
    return [
        f"GET {path} HTTP/1.1\nHost: 127.0.0.1\n{auth}\nConnection: close\n\n",
        f"GET {path} HTTP/1.1\rHost: 127.0.0.1\r{auth}\r\r\n",
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\nno colon {token}\r\n\r\n",
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\nContent-Length: x{token}\r\n\r\n",
        f"G@T {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n\r\n",
    ]  # fmt: skip


async def send_all(port: int, requests: list[bytes]) -> list[int]:
    """Send each request on its own connection; the statuses of the answers (0: none)."""
    statuses = []
    for request in requests:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.read(65536), 20)
        finally:
            writer.close()
        statuses.append(int(head.split()[1]) if head.startswith(b"HTTP/") else 0)
    return statuses


def check_caplog(caplog: pytest.LogCaptureFixture, token: str, server: str) -> None:
    assert token not in caplog.text
    said = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 1, [r.getMessage() for r in said]  # one line, the rest counted
    line = said[0].getMessage()
    assert line.startswith(f"{server}: a malformed request from 127.0.0.1: ")
    assert "\n" not in line and said[0].exc_info is None


async def test_the_ui_logs_malformed_requests_briefly_without_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = "SECRET" + secrets.token_hex(8)
    caplog.set_level(logging.DEBUG)
    async with ui(tmp_path / "project") as server:
        bad = [r.encode() for r in malformed("/api/", token)] * ROUNDS
        statuses = await send_all(server.port, bad)
        assert set(statuses) == {400}, statuses
        check_caplog(caplog, token, "the UI")
        status, _, _ = await exchange(server.port, get("/api/", f"127.0.0.1:{server.port}"))
        assert status == 200  # still serving


async def test_the_proxy_logs_malformed_requests_briefly_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = "SECRET" + secrets.token_hex(8)
    caplog.set_level(logging.DEBUG)
    proxy = ServiceProxy()
    port = await proxy.start("127.0.0.1", 0)
    try:
        bad = [r.encode() for r in malformed("/proxy/services/web/", token)] * ROUNDS
        statuses = await send_all(port, bad)
        assert set(statuses) == {400}, statuses
        check_caplog(caplog, token, "the service proxy")
        status, _, _ = await exchange(port, get("/proxy/services/web/", f"127.0.0.1:{port}"))
        assert status == 404  # still serving (no such service)
    finally:
        await proxy.stop()


def test_the_agent_logs_malformed_requests_briefly_without_the_token(
    agent: AgentProcess,
) -> None:
    token = agent.token  # the real one: what a client of this agent sends
    port = int(agent.url.rstrip("/").rsplit(":", 1)[1])
    before = len(agent.log())
    bad = [r.encode() for r in malformed("/health", token)] * ROUNDS
    statuses = asyncio.run(send_all(port, bad))
    assert 400 in statuses and 501 in statuses, statuses
    status = asyncio.run(exchange(port, get("/health", "x", f"Authorization: Bearer {token}")))[0]
    assert status == 200  # still serving
    logged = agent.log()[before:]  # the agent runs with --log-level debug
    assert token not in logged
    said = [line for line in logged.splitlines() if " DEBUG " not in line]
    assert len(said) == 1, said
    assert "WARNING dstack_plan.agent.server: a malformed request from 127.0.0.1: " in said[0]
    assert "Traceback" not in logged


async def test_a_malformed_answer_of_a_replica_does_not_log_the_request_headers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An `auth: false` service gets the client's `Authorization` as it is; when its replica
    answers something that does not parse, the proxy's warning must not quote it."""
    token = "SECRET" + secrets.token_hex(8)

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /bad"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n")
        else:  # the probe
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(replica, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    route = ServiceRoute(
        name="open", upstreams=[Upstream(replica_id="r0", url=url)], probe=FAST_PROBE
    )
    proxy = ServiceProxy([route])
    port = await proxy.start("127.0.0.1", 0)
    caplog.set_level(logging.DEBUG)
    try:
        await wait_healthy(proxy, "open", 1)
        auth = f"Authorization: Bearer {token}"
        status, _, body = await exchange(
            port, get(f"/proxy/services/open/bad?key={token}", f"127.0.0.1:{port}", auth)
        )
        assert status == 502, body
        assert token not in body.decode()
        failed = [r.getMessage() for r in caplog.records if "replica open/r0" in r.getMessage()]
        assert failed and all("\n" not in line for line in failed), failed
        assert token not in caplog.text
    finally:
        await proxy.stop()
        server.close()
        await server.wait_closed()
