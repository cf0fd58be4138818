"""The service proxy over real sockets on loopback: replicas are `python3 -m http.server`
processes and small aiohttp servers in the test; no Docker, no SSH."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from dstack_plan.clock import FakeClock
from dstack_plan.proxy import ProbeSettings, RequestStats, ServiceProxy, ServiceRoute, Upstream

pytestmark = pytest.mark.timeout(300)

FAST_PROBE = ProbeSettings(interval=0.1, timeout=1.0)
NET_POLLS = 6000
"""Polls (10 ms apart, at least) before a polling loop gives up (a safety net: passing never
waits it out)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FileReplica:
    """`python3 -m http.server` serving a directory whose `who.txt` names the replica."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.dir = root / name
        self.dir.mkdir()
        (self.dir / "who.txt").write_text(name)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def upstream(self) -> Upstream:
        return Upstream(replica_id=self.name, url=f"http://127.0.0.1:{self.port}")

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1"],
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise AssertionError(f"replica {self.name} did not start")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Sequence[FileReplica]]:
    pair = [FileReplica(tmp_path, "a"), FileReplica(tmp_path, "b")]
    for replica in pair:
        replica.start()
    yield pair
    for replica in pair:
        replica.kill()


@asynccontextmanager
async def running(proxy: ServiceProxy) -> AsyncIterator[str]:
    port = await proxy.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await proxy.stop()


@asynccontextmanager
async def app_server(app: web.Application) -> AsyncIterator[Upstream]:
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Upstream(replica_id=f"app-{port}", url=f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


async def wait_healthy(proxy: ServiceProxy, service: str, count: int) -> None:
    for _ in range(NET_POLLS):  # a safety net: a probe every 0.1 s (FAST_PROBE)
        if len(proxy.healthy(service)) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{service}: healthy {proxy.healthy(service)}, wanted {count}")


async def who(client: aiohttp.ClientSession, base: str) -> str:
    async with client.get(f"{base}/proxy/services/files/who.txt") as response:
        assert response.status == 200, await response.text()
        return await response.text()


def echo_app(tag: str) -> web.Application:
    """Answers with what it received: its tag, method, path and headers."""

    async def echo(request: web.Request) -> web.Response:
        body = await request.text()
        return web.json_response(
            {
                "tag": tag,
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
            }
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


async def test_balances_fails_over_and_recovers(replicas: Sequence[FileReplica]) -> None:
    route = ServiceRoute(name="files", upstreams=[r.upstream for r in replicas], probe=FAST_PROBE)
    proxy = ServiceProxy([route], wait_for_replica=5)
    async with running(proxy) as base, aiohttp.ClientSession() as client:
        await wait_healthy(proxy, "files", 2)
        assert {await who(client, base) for _ in range(6)} == {"a", "b"}

        replicas[0].kill()
        # at once: the first connection refused fails over to b, and takes a out of rotation
        assert [await who(client, base) for _ in range(10)] == ["b"] * 10
        assert proxy.healthy("files") == ["b"]

        replicas[0].start()
        await wait_healthy(proxy, "files", 2)
        assert {await who(client, base) for _ in range(6)} == {"a", "b"}


async def test_streams_unbuffered() -> None:
    first_seen = asyncio.Event()
    wrote_last: list[bool] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: first\n\n")
        # the rest only once the client saw the first chunk (or, if it never does, after a
        # minute: a proxy holding the first chunk back fails the test, if slowly)
        try:
            await asyncio.wait_for(first_seen.wait(), 60)
        except asyncio.TimeoutError:
            pass
        for n in range(3):
            await asyncio.sleep(0.05)
            await response.write(f"data: {n}\n\n".encode())
        wrote_last.append(True)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/events", stream)
    async with app_server(app) as upstream:
        route = ServiceRoute(name="sse", upstreams=[upstream], token=None, probe=FAST_PROBE)
        stats = RequestStats()
        proxy = ServiceProxy([route], stats=stats)
        async with running(proxy) as base, aiohttp.ClientSession() as client:
            await wait_healthy(proxy, "sse", 1)
            async with client.get(f"{base}/proxy/services/sse/events") as response:
                assert response.headers["Content-Type"] == "text/event-stream"
                first = await response.content.readuntil(b"\n\n")
                assert first == b"data: first\n\n"
                assert not wrote_last, "the proxy held the first chunk until the end"
                assert stats.in_flight("sse") == 1
                first_seen.set()
                rest = await response.read()
            assert rest == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            assert stats.in_flight("sse") == 0


async def test_auth_and_forwarded_headers() -> None:
    async with app_server(echo_app("private")) as upstream:
        route = ServiceRoute(
            name="private",
            upstreams=[upstream],
            token="s3cret",
            probe=FAST_PROBE,
            hostname="Private.GW.example.test",
        )
        proxy = ServiceProxy([route])
        async with running(proxy) as base, aiohttp.ClientSession() as client:
            await wait_healthy(proxy, "private", 1)
            url = f"{base}/proxy/services/private/some/path?x=1"
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                async with client.get(url, headers=headers) as response:
                    assert response.status == 401
                    assert (await response.json())["error"]["type"] == "unauthorized"
            good = {"Authorization": "Bearer s3cret", "X-Forwarded-For": "10.1.2.3"}
            async with client.post(url, headers=good, data=b"hello") as response:
                assert response.status == 200
                seen = await response.json()
            assert seen["path"] == "/some/path?x=1"
            assert seen["body"] == "hello"
            assert "Authorization" not in seen["headers"]
            assert seen["headers"]["X-Forwarded-For"] == "10.1.2.3, 127.0.0.1"
            assert seen["headers"]["X-Forwarded-Proto"] == "http"

            # a gateway routes by Host as well, keeping the path
            host = {**good, "Host": "private.gw.example.test"}
            async with client.get(f"{base}/v1/anything", headers=host) as response:
                assert response.status == 200
                assert (await response.json())["path"] == "/v1/anything"
            async with client.get(f"{base}/proxy/services/nope/") as response:
                assert response.status == 404


async def test_openai_models_and_routing_by_model() -> None:
    async with (
        app_server(echo_app("llama")) as llama,
        app_server(echo_app("qwen")) as qwen,
    ):
        routes = [
            ServiceRoute(name="llama", upstreams=[llama], model="llama-3", probe=FAST_PROBE),
            ServiceRoute(
                name="qwen",
                upstreams=[qwen],
                model="qwen-2",
                model_prefix="/openai/v1",
                token="t",
                probe=FAST_PROBE,
            ),
            ServiceRoute(name="plain", upstreams=[], probe=FAST_PROBE),
        ]
        proxy = ServiceProxy(routes)
        async with running(proxy) as base, aiohttp.ClientSession() as client:
            await wait_healthy(proxy, "llama", 1)
            await wait_healthy(proxy, "qwen", 1)
            async with client.get(f"{base}/v1/models") as response:
                assert [m["id"] for m in (await response.json())["data"]] == ["llama-3"]
            auth = {"Authorization": "Bearer t"}
            async with client.get(f"{base}/v1/models", headers=auth) as response:
                listed = (await response.json())["data"]
                assert [m["id"] for m in listed] == ["llama-3", "qwen-2"]

            chat = f"{base}/v1/chat/completions"
            body = {"model": "qwen-2", "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(chat, json=body, headers=auth) as response:
                seen = await response.json()
            assert (seen["tag"], seen["path"]) == ("qwen", "/openai/v1/chat/completions")
            async with client.post(chat, json={**body, "model": "llama-3"}) as response:
                assert (await response.json())["tag"] == "llama"
            async with client.post(chat, json={**body, "model": "gpt-9"}) as response:
                assert response.status == 404
                assert (await response.json())["error"]["type"] == "model_not_found"


async def test_scale_from_zero_waits_then_503() -> None:
    async with app_server(echo_app("late")) as upstream:
        empty = ServiceRoute(name="svc", upstreams=[], probe=FAST_PROBE)
        proxy = ServiceProxy([empty], wait_for_replica=3600)
        async with running(proxy) as base, aiohttp.ClientSession() as client:
            waiting = asyncio.ensure_future(client.get(f"{base}/proxy/services/svc/hello"))
            for _ in range(NET_POLLS):  # until the request reached the proxy
                if proxy.stats.in_flight("svc") == 1:
                    break
                await asyncio.sleep(0.01)
            assert proxy.stats.in_flight("svc") == 1  # the autoscaler sees the demand
            assert not waiting.done()  # held, waiting for a replica (for up to an hour)
            proxy.set_routes([empty.model_copy(update={"upstreams": (upstream,)})])
            # answered because a replica came (a safety net: it would wait an hour else)
            async with await asyncio.wait_for(waiting, 60) as response:
                assert response.status == 200
                assert (await response.json())["path"] == "/hello"

        # none comes: the request is answered 503 once it has waited what it may wait
        proxy = ServiceProxy([empty], wait_for_replica=0.2)
        async with running(proxy) as base, aiohttp.ClientSession() as client:
            async with client.get(f"{base}/proxy/services/svc/") as response:
                assert response.status == 503
                error = (await response.json())["error"]
        assert error["type"] == "no_replica"
        assert error["message"] == "service 'svc' has no healthy replica (waited 0.2s for one)"


async def test_set_routes_keeps_health_of_staying_replicas() -> None:
    async with app_server(echo_app("one")) as one, app_server(echo_app("two")) as two:
        slow = ProbeSettings(interval=30, timeout=1.0)  # a new replica gets one probe only
        proxy = ServiceProxy([ServiceRoute(name="svc", upstreams=[one], probe=slow)])
        async with running(proxy):
            await wait_healthy(proxy, "svc", 1)
            proxy.set_routes([ServiceRoute(name="svc", upstreams=[one, two], probe=slow)])
            assert proxy.healthy("svc") == [one.replica_id]  # kept, not re-probed
            await wait_healthy(proxy, "svc", 2)
            proxy.set_routes([ServiceRoute(name="svc", upstreams=[two], probe=slow)])
            assert proxy.healthy("svc") == [two.replica_id]


async def test_rps_with_injected_clock() -> None:
    clock = FakeClock()
    async with app_server(echo_app("x")) as upstream:
        route = ServiceRoute(name="svc", upstreams=[upstream], probe=FAST_PROBE)
        proxy = ServiceProxy([route], stats=RequestStats(clock=clock))
        async with running(proxy) as base, aiohttp.ClientSession() as client:
            await wait_healthy(proxy, "svc", 1)
            for _second in range(30):
                clock.advance(1)
                for _ in range(2):
                    async with client.get(f"{base}/proxy/services/svc/") as response:
                        assert response.status == 200
            async with client.get(f"{base}/proxy/services/nope/"):
                pass  # not a service: not counted
    stats = proxy.stats
    assert stats.total("svc") == 60
    assert stats.rps("svc", window=60) == pytest.approx(1.0)
    assert stats.rps("svc", window=30) == pytest.approx(2.0)
    assert stats.services() == ["svc"]
    clock.advance(45)
    assert stats.rps("svc", window=30) == 0.0
    assert stats.rps("svc", window=60) == pytest.approx(30 / 60)
