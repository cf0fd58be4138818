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
        await client.aclose()
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
    for header in (b"host: 127.0.0.1:", b"x-token: t"):
        assert header in request.lower()
    assert b"connection: close" not in request.lower()  # kept for the next request
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


async def _answer_each(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[bytes], limit: int
) -> None:
    """Answer up to `limit` requests on this connection (each `200` with its path), then
    close it."""
    for _ in range(limit):
        try:
            head = await read_head(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        seen.append(head)
        path = head.split(b" ")[1]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(path), path))
        await writer.drain()
    writer.close()


async def test_one_connection_carries_request_after_request() -> None:
    connections: list[int] = []
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await _answer_each(reader, writer, seen, 100)

    async with server(handler) as client:
        answers = [(await client.request("GET", f"/r{i}")).text for i in range(5)]
    assert answers == [f"/r{i}" for i in range(5)]
    assert len(connections) == 1 and len(seen) == 5


async def test_a_kept_connection_the_server_closed_is_replaced_unseen() -> None:
    """The agent closes idle connections: the next request goes on a new one, once."""
    connections: list[int] = []
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await _answer_each(reader, writer, seen, 1)  # then closes, as an idle timeout does

    async with server(handler) as client:
        first = await client.request("GET", "/first")
        await asyncio.sleep(0.05)  # the server's close arrives while the connection is kept
        second = await client.request("POST", "/second", content=b"x")
    assert (first.text, second.text) == ("/first", "/second")
    assert len(connections) == 2
    assert [h.split(b" ")[1] for h in seen] == [b"/first", b"/second"]  # each sent once


async def test_a_kept_connection_that_times_out_is_not_asked_again() -> None:
    """Silence is no closed connection: the agent may be working on the request, which is
    not sent a second time."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_head(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n/first")
        await writer.drain()
        seen.append(await read_head(reader))  # the second request, never answered
        await asyncio.sleep(30)

    async with server(handler) as client:
        await client.request("GET", "/first")
        with pytest.raises(TransportError, match="timed out"):
            await client.request("GET", "/slow", timeout=0.3)
    assert [h.split(b" ")[1] for h in seen] == [b"/first", b"/slow"]
