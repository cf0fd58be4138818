"""HTTP/1.1 requests over any pair of asyncio-style streams, for the agent API.

h11 speaks the protocol; the bytes travel over whatever `connect` opens: a TCP connection to
the local agent, or a channel of an SSH connection to a remote one (asyncssh's
`open_connection` gives the same reader/writer pair), so no local port has to be forwarded.
A connection whose exchange ended cleanly is kept for the next request (HTTP/1.1 keep-alive,
a few per client, for `KEEP_IDLE_SECONDS`): an apply of thousands of runs, or a watch tick
asking a hundred agents, would otherwise open a TCP connection or an SSH channel, and the
agent a thread, for every request. A kept connection the agent has closed meanwhile fails
before any answer arrives; the request is then sent once more on a new one (every agent call
is safe to repeat: a submit is idempotent per job id).

(httpx did this job first. With httpcore, anyio and their TLS setup, which a loopback or SSH
hop never needs, it cost about 100 ms of every CLI start.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import h11

READ_SIZE = 64 * 1024
KEEP_IDLE = 8
"""Connections a client keeps open between requests."""
KEEP_IDLE_SECONDS = 20.0
"""How long a kept connection may wait for its next request: well under the agent's own
idle limit (60 s), so that the agent seldom closes one as it is being reused."""


class Reader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...
    async def wait_closed(self) -> None: ...


Connector = Callable[[], Awaitable[tuple[Reader, Writer]]]
"""Opens one connection to the agent: `asyncio.open_connection` or an SSH channel."""


def tcp(host: str, port: int) -> Connector:
    """A connector for a plain TCP address."""

    def connect() -> Awaitable[tuple[Reader, Writer]]:
        return asyncio.open_connection(host, port)

    return connect


class TransportError(Exception):
    """No complete answer: the connection failed, timed out, or broke off mid-message."""


class ConnectionLost(TransportError):
    """The connection was closed or reset (not timed out): on a kept connection, before any
    answer, the agent closed it while idle and never read the request."""


@dataclass
class Response:
    """A response read to its end."""

    status_code: int
    reason_phrase: str
    headers: dict[str, str] = field(default_factory=dict)
    """Header names in lower case."""
    content: bytes = b""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class StreamingResponse:
    """A response whose body is read as it arrives (`aiter_raw`) or at once (`aread`)."""

    def __init__(self, head: h11.Response, exchange: _Exchange, read_timeout: float):
        self.status_code = head.status_code
        self.reason_phrase = head.reason.decode("latin-1")
        self.headers = _headers(head)
        self._exchange = exchange
        self._read_timeout = read_timeout

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            event = await self._exchange.next_event(self._read_timeout)
            if isinstance(event, h11.EndOfMessage):
                return
            if isinstance(event, h11.Data):
                yield bytes(event.data)

    async def aread(self) -> Response:
        body = b"".join([chunk async for chunk in self.aiter_raw()])
        return Response(self.status_code, self.reason_phrase, self.headers, body)


class HttpClient:
    """Requests to one agent; `headers` go with every request (the bearer token)."""

    def __init__(self, connect: Connector, *, host: str, headers: dict[str, str], timeout: float):
        self._connect = connect
        self._host = host
        self._headers = headers
        self.timeout = timeout
        self._idle: list[_Exchange] = []

    async def aclose(self) -> None:
        """Close the connections kept for later requests."""
        idle, self._idle = self._idle, []
        for exchange in idle:
            await exchange.close()

    async def request(
        self,
        method: str,
        target: str,
        *,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Send one request and read the whole response; TransportError if that fails."""
        wait = self.timeout if timeout is None else timeout
        async with self.stream(
            method, target, content=content, headers=headers, timeout=wait, read_timeout=wait
        ) as response:
            return await response.aread()

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        target: str,
        *,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        read_timeout: float | None = None,
    ) -> AsyncIterator[StreamingResponse]:
        """Send one request; the body is read inside the block. `timeout` bounds connecting,
        sending and the response head; `read_timeout` each wait for more of the body."""
        wait = self.timeout if timeout is None else timeout
        request = self._request(method, target, content, headers)
        exchange = self._kept()
        try:
            if exchange is not None:
                try:
                    head = await exchange.ask(request, content, wait)
                except ConnectionLost:  # the agent closed it meanwhile: once more, anew
                    await exchange.close()
                    exchange = None
            if exchange is None:
                exchange = _Exchange()
                await exchange.open(self._connect, wait)
                head = await exchange.ask(request, content, wait)
            yield StreamingResponse(head, exchange, wait if read_timeout is None else read_timeout)
        finally:
            if exchange is not None:
                if len(self._idle) < KEEP_IDLE and exchange.reusable():
                    self._idle.append(exchange)
                else:
                    await exchange.close()

    def _kept(self) -> _Exchange | None:
        """A kept connection of this event loop, still fresh; None when there is none."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        while self._idle:
            exchange = self._idle.pop()
            if exchange.loop is loop and now - exchange.idle_since < KEEP_IDLE_SECONDS:
                return exchange
            if exchange.loop is loop:
                exchange.close_soon()
            # one of a loop that has ended is dropped: its transport went with that loop
        return None

    def _request(
        self, method: str, target: str, content: bytes | None, extra: dict[str, str] | None
    ) -> h11.Request:
        headers = [("Host", self._host), *self._headers.items()]
        headers.extend((extra or {}).items())
        if content is not None:
            headers.append(("Content-Length", str(len(content))))
        return h11.Request(method=method, target=target, headers=headers)


class _Exchange:
    """One connection carrying requests and their responses, one after the other."""

    def __init__(self) -> None:
        self._protocol = h11.Connection(h11.CLIENT)
        self._reader: Reader | None = None
        self._writer: Writer | None = None
        self.loop = asyncio.get_running_loop()
        self.idle_since = 0.0
        self._answered = False
        """Whether any byte of the current response has arrived."""

    async def open(self, connect: Connector, timeout: float) -> None:
        self._reader, self._writer = await self._guard(connect(), timeout, "connecting")

    async def ask(self, request: h11.Request, content: bytes | None, timeout: float) -> Any:
        """Send `request` and read the head of its response."""
        self._answered = False
        await self.send(request, content, timeout)
        head = await self.next_event(timeout)
        while isinstance(head, h11.InformationalResponse):  # a 1xx before the answer
            head = await self.next_event(timeout)
        return head

    async def send(self, request: h11.Request, content: bytes | None, timeout: float) -> None:
        assert self._writer is not None
        data = self._protocol.send(request) or b""
        if content:
            data += self._protocol.send(h11.Data(data=content)) or b""
        data += self._protocol.send(h11.EndOfMessage()) or b""
        try:
            self._writer.write(data)
        except Exception as err:  # noqa: BLE001 - a closed TCP stream or SSH channel
            raise ConnectionLost(f"{type(err).__name__}: {err}") from None
        await self._on_stream(self._writer.drain(), timeout, "sending the request")

    def reusable(self) -> bool:
        """The exchange ended cleanly and both sides keep the connection: ready for the next
        request (made so here)."""
        if self._writer is None or self._protocol.states != {
            h11.CLIENT: h11.DONE,
            h11.SERVER: h11.DONE,
        }:
            return False
        self._protocol.start_next_cycle()
        self.idle_since = time.monotonic()
        return True

    def close_soon(self) -> None:
        """Close without waiting for the other side to see it."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    async def next_event(self, timeout: float) -> Any:
        """The next response event (head, data, end), reading from the wire as needed."""
        assert self._reader is not None
        while True:
            try:
                event = self._protocol.next_event()
            except h11.RemoteProtocolError as err:
                if not self._answered:
                    # closed before a byte of the answer (h11 calls that a protocol error)
                    raise ConnectionLost(
                        "the agent closed the connection without an answer"
                    ) from None
                raise TransportError(f"the agent's answer broke off: {err}") from None
            if event is not h11.NEED_DATA:
                if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                    raise ConnectionLost("the agent closed the connection without an answer")
                return event
            data = await self._on_stream(self._reader.read(READ_SIZE), timeout, "waiting for data")
            self._answered = self._answered or bool(data)
            self._protocol.receive_data(data)  # b"" tells h11 the peer closed

    async def close(self) -> None:
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        try:
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass  # the answer is complete (or already failed); a slow close changes nothing

    @classmethod
    async def _on_stream(cls, step: Awaitable[Any], timeout: float, doing: str) -> Any:
        """`_guard` for a read or write of the open stream: whatever else it raises (an SSH
        channel raises its library's own errors when its connection is lost) means the
        connection is gone."""
        try:
            return await cls._guard(step, timeout, doing)
        except TransportError:
            raise
        except Exception as err:  # noqa: BLE001 - asyncssh's, which this module cannot name
            raise ConnectionLost(f"{type(err).__name__}: {err}") from None

    @staticmethod
    async def _guard(step: Awaitable[Any], timeout: float, doing: str) -> Any:
        # Not asyncio.wait_for: before Python 3.12 it swallows a cancellation that comes as
        # `step` completes, and a cancelled log stream then waits for ever (Ctrl-C hung).
        task = asyncio.ensure_future(step)
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            raise TransportError(f"timed out after {timeout:g}s {doing}")
        try:
            return task.result()
        except asyncio.TimeoutError:
            raise TransportError(f"timed out after {timeout:g}s {doing}") from None
        except (ConnectionError, EOFError) as err:
            raise ConnectionLost(f"{type(err).__name__}: {err}") from None
        except OSError as err:
            raise TransportError(f"{type(err).__name__}: {err}") from None


def _headers(head: h11.Response) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
