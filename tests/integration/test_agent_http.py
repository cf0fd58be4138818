"""The agent's HTTP/1.1 client against small servers on loopback that misbehave on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from dstack_plan.agent.http import HttpClient, TransportError, tcp

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[HttpClient]:
    """A server running `handler` per connection, and a client of it."""
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    client = HttpClient(
        tcp("127.0.0.1", port), host=f"127.0.0.1:{port}", headers={"X-Token": "t"}, timeout=2
    )
    try:
        yield client
    finally:
        srv.close()
        await srv.wait_closed()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def test_request_and_json_answer() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_head(reader)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        seen.append(head + await reader.readexactly(length))
        body = b'{"ok": true}'
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async with server(handler) as client:
        response = await client.request("POST", "/jobs?x=1%202", content=b'{"a": 1}')
    assert response.status_code == 201 and response.reason_phrase == "Created"
    assert response.json() == {"ok": True}
    request = seen[0]
    assert request.startswith(b"POST /jobs?x=1%202 HTTP/1.1\r\n")
    for header in (b"host: 127.0.0.1:", b"connection: close", b"x-token: t"):
        assert header in request.lower()
    assert request.endswith(b'\r\n\r\n{"a": 1}')


async def test_a_streamed_body_arrives_chunk_by_chunk() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Log-Offset: 7\r\n\r\n")
        writer.write(b"5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()  # the client must see "first" before "second" is even sent
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with server(handler) as client:
        async with client.stream("GET", "/logs", read_timeout=2) as response:
            assert response.headers["x-log-offset"] == "7"
            chunks = []
            async for data in response.aiter_raw():
                chunks.append(data)
                release.set()
    assert b"".join(chunks) == b"firstsecond" and chunks[0] == b"first"


async def test_a_body_cut_short_is_a_transport_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..")
        await writer.drain()
        writer.close()

    async with server(handler) as client:
        with pytest.raises(TransportError, match="broke off"):
            await client.request("GET", "/health")


async def test_a_connection_closed_without_answer_is_a_transport_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.close()

    async with server(handler) as client:
        with pytest.raises(TransportError):
            await client.request("GET", "/health")


async def test_silence_times_out() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        await asyncio.sleep(5)

    async with server(handler) as client:
        with pytest.raises(TransportError, match=r"timed out after 0.2s waiting for data"):
            await client.request("GET", "/health", timeout=0.2)


async def test_nobody_listening_is_a_transport_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    client = HttpClient(tcp("127.0.0.1", port), host="h", headers={}, timeout=2)
    with pytest.raises(TransportError, match="ConnectionRefusedError"):
        await client.request("GET", "/health")
