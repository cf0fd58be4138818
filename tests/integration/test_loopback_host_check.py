"""DNS rebinding: the UI/API of `dstack ui` and watch's service proxy, listening on loopback,
answer only requests that name loopback in `Host:` (a page whose own name was pointed at
127.0.0.1 sends `Host: evil.example`). Real servers on loopback, raw HTTP requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from dstack_plan.project import Project
from dstack_plan.proxy import ServiceProxy, ServiceRoute
from dstack_plan.web.server import WebServer, start_server
from dstack_plan.web.source import ApiSource
from tests.integration.test_proxy import FAST_PROBE, app_server, echo_app, wait_healthy

pytestmark = pytest.mark.timeout(60)

EVIL = ("evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}",
        "localhost.evil.example", "[::2]:{port}", "", "localhost:{port}@evil.example")  # fmt: skip
LOOPBACK = ("127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LocalHost:{port}",
            "127.0.0.1", "localhost")  # fmt: skip


async def exchange(
    port: int, request: bytes, address: str = "127.0.0.1"
) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as it is; (status, headers lower-cased, body) of the answer."""
    reader, writer = await asyncio.open_connection(address, port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 20)  # `Connection: close`
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return int(status_line.split()[1]), headers, body


def get(path: str, host: str, *extra: str, method: str = "GET", body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close", *extra]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@asynccontextmanager
async def ui(directory: Path, bind: str = "127.0.0.1:0") -> AsyncIterator[WebServer]:
    """`dstack ui`'s server over an empty project."""
    directory.mkdir(exist_ok=True)
    source = ApiSource(Project(directory), new_project=lambda: Project(directory))
    server = await start_server(source, bind, directory)
    try:
        yield server
    finally:
        await server.close()


async def test_the_ui_on_loopback_refuses_a_foreign_host(tmp_path: Path) -> None:
    async with ui(tmp_path / "project") as server:
        port = server.port
        for host in EVIL:
            for path in ("/api/", "/api/runs", "/api/events", "/openapi.json", "/", "/events"):
                status, headers, body = await exchange(port, get(path, host.format(port=port)))
                assert status == 421, (host, path, status, body)
                assert headers["content-type"].startswith("text/plain")
                assert body.startswith(b"misdirected request") and len(body) < 300
        # HEAD and other methods too
        status, _, _ = await exchange(port, get("/api/", "evil.example", method="HEAD"))
        assert status == 421

        for host in LOOPBACK:
            status, headers, body = await exchange(port, get("/api/", host.format(port=port)))
            assert status == 200, (host, body)
            assert headers["content-type"].startswith("application/json")
            assert b'"endpoints"' in body
        status, _, body = await exchange(port, get("/api/runs", f"localhost:{port}"))
        assert (status, body) == (200, b"[]")
        # an HTTP/1.0 tool that sends no Host at all (a browser always sends one)
        status, _, _ = await exchange(port, b"GET /api/ HTTP/1.0\r\n\r\n")
        assert status == 200


async def test_off_loopback_the_token_rules_and_host_is_not_checked(tmp_path: Path) -> None:
    async with ui(tmp_path / "project", "127.0.0.2:0") as server:
        token = (tmp_path / "project" / ".dstack" / "ui-token").read_text().strip()
        port = server.port
        status, _, _ = await exchange(port, get("/api/", "evil.example"), "127.0.0.2")
        assert status == 401
        bearer = f"Authorization: Bearer {token}"
        status, _, _ = await exchange(port, get("/api/", "dstack.lan:3000", bearer), "127.0.0.2")
        assert status == 200


async def test_the_proxy_on_loopback_refuses_a_foreign_host_but_not_a_gateway_name() -> None:
    async with app_server(echo_app("web")) as upstream:
        route = ServiceRoute(
            name="web",
            upstreams=[upstream],
            model="m-1",
            probe=FAST_PROBE,
            hostname="web.gw.example.test",
        )  # auth: false, so only the Host rule stands between a page and the service
        proxy = ServiceProxy([route])
        port = await proxy.start("127.0.0.1", 0)
        try:
            await wait_healthy(proxy, "web", 1)
            chat = b'{"model": "m-1", "messages": []}'
            for host in EVIL:
                name = host.format(port=port)
                for request in (
                    get("/proxy/services/web/private", name),
                    get("/v1/models", name),
                    get("/v1/chat/completions", name, method="POST", body=chat),
                    get("/proxy/services/nope/", name),
                ):
                    status, headers, body = await exchange(port, request)
                    assert status == 421, (name, request, body)
                    assert headers["content-type"].startswith("text/plain")
                    assert body.startswith(b"misdirected request")

            for host in LOOPBACK:
                name = host.format(port=port)
                status, _, body = await exchange(port, get("/proxy/services/web/x?y=1", name))
                assert status == 200, (name, body)
                assert b'"tag": "web"' in body and b'"path": "/x?y=1"' in body
                status, _, body = await exchange(port, get("/v1/models", name))
                assert status == 200 and b'"m-1"' in body
            # a gateway's requests come through its tunnel with the service's name
            status, _, body = await exchange(port, get("/x", "Web.GW.example.test:443"))
            assert status == 200 and b'"path": "/x"' in body
        finally:
            await proxy.stop()
