"""`ServiceProxy`: HTTP in, to a healthy replica of the right service, streamed both ways.

Routing, first match wins:
- `Host:` a service's `hostname` (`<run>.<domain>` of its gateway): the path as it is;
- `/proxy/services/<service>/<path>`: `/<path>` (the prefix is stripped);
- `GET /v1/models`: the services with a model, as an OpenAI model list;
- any other `/v1/<path>`: to the service whose model is the JSON body's `model`, at
  `<model_prefix>/<path>` (this one body is read whole, to find the model).

Auth: a service with a token wants `Authorization: Bearer <token>` (401 otherwise), and the
header is then not forwarded: it is the proxy's credential, not the replica's. A service
with `auth: false` gets the client's `Authorization` as it is.

Retries: a failed connect (the replica is gone) marks the replica down at once and retries
another, whatever the method: the request never reached it. Another failure before any
response byte is retried only for idempotent methods, and only while the request body was
not streamed yet. Once a response has started nothing is retried. With no healthy replica,
a request waits up to `wait_for_replica` for one (a service scaled to zero gets its first
replica while its first request waits), then gets a 503.

Errors are OpenAI-shaped JSON: `{"error": {"message", "type", "code"}}`.

On loopback (`start` on 127.0.0.0/8, ::1 or localhost), a request not routed by a service's
hostname must say `Host: 127.0.0.1`, `localhost` or `[::1]` (any port), against DNS rebinding
(`loopback.py`): others get a plain-text 421. A request that does not parse is logged as one
brief rate-limited line, never its bytes (`protocol_log.py`), and there is no access log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from dstack_plan.clock import Clock
from dstack_plan.proxy.balancer import Balancer
from dstack_plan.proxy.client import http_probe, upstream_session
from dstack_plan.proxy.headers import end_to_end, request_headers
from dstack_plan.proxy.health import HealthMonitor, ProbeCheck
from dstack_plan.proxy.loopback import MISDIRECTED, allowed_hosts, host_allowed, refusal
from dstack_plan.proxy.model import ServiceRoute, Upstream
from dstack_plan.proxy.protocol_log import brief, server_logger
from dstack_plan.proxy.stats import RequestStats

logger = logging.getLogger(__name__)

SERVICES_PREFIX = "/proxy/services/"
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
MODEL_BODY_LIMIT = 16 * 1024 * 1024
"""The largest `/v1/...` body read to find its model (a long chat context fits)."""
MAX_ATTEMPTS = 8
_CONNECT_ERRORS: tuple[type[Exception], ...] = (
    aiohttp.ClientConnectorError,
    getattr(aiohttp, "ConnectionTimeoutError", aiohttp.ClientConnectorError),  # aiohttp>=3.10
)


@dataclass
class _Service:
    route: ServiceRoute
    balancer: Balancer = field(default_factory=Balancer)
    upstreams: dict[str, Upstream] = field(default_factory=dict)


class _ProxyError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class _Retry(Exception):
    """This attempt failed before the replica answered; another replica may be tried."""


class _OnceBody:
    """The client's request body, streamed; remembers whether reading it has begun (after
    which it cannot be sent again)."""

    def __init__(self, content: aiohttp.StreamReader) -> None:
        self._content = content
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        async for chunk in self._content.iter_any():
            yield chunk


class ServiceProxy:
    """The proxy of a set of services; one instance per listening address.

    Call `set_routes` whenever replicas change (from the event loop the proxy runs in);
    read `stats` for request rates. `check` replaces the HTTP probe (tests); `clock` paces
    the probes.
    """

    def __init__(
        self,
        routes: Sequence[ServiceRoute] = (),
        *,
        wait_for_replica: float = 60.0,
        read_timeout: float | None = 300.0,
        connect_timeout: float = 5.0,
        max_connections: int = 10_000,
        stats: RequestStats | None = None,
        clock: Clock | None = None,
        check: ProbeCheck | None = None,
    ) -> None:
        self.wait_for_replica = wait_for_replica
        self.stats = stats or RequestStats()
        self._read_timeout = read_timeout
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._clock = clock
        self._check = check
        self._services: dict[str, _Service] = {}
        self._changed = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._monitor: HealthMonitor | None = None
        self._runner: web.ServerRunner | None = None
        self._hosts: frozenset[str] | None = None
        """The `Host` names answered on loopback (None: any), besides services' hostnames."""
        self.set_routes(routes)

    # -- lifecycle ------------------------------------------------------------------------

    async def open(self, host: str = "127.0.0.1") -> None:
        """Start probing and forwarding, without a listener of its own: another server (the
        UI's, `web/app.py`) hands this proxy the requests `wants` claims, through `handle`.
        `host` is where that server listens (on loopback, the `Host:` rule applies)."""
        self._session = upstream_session(
            self._max_connections, self._connect_timeout, self._read_timeout
        )
        check = self._check or http_probe(self._session)
        self._monitor = HealthMonitor(check, self._on_health, self._clock)
        for service in self._services.values():
            self._monitor.sync(service.route.name, service.route.upstreams, service.route.probe)
        self._hosts = allowed_hosts(host)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on `host:port` (0: any free port) and start probing; returns the port."""
        await self.open(host)
        server = web.Server(
            self._handle, access_log=None, logger=server_logger(logger, "the service proxy")
        )
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=4096)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening, probing and forwarding (open streams are cut)."""
        if self._monitor is not None:
            await self._monitor.close()
            self._monitor = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- routes and health ----------------------------------------------------------------

    def set_routes(self, routes: Sequence[ServiceRoute]) -> None:
        """Serve exactly `routes` from now on. A replica that stays (same service, replica
        id and URL) keeps its health; a new one takes traffic once its probes pass."""
        wanted = {r.name: r for r in routes}
        if len(wanted) != len(routes):
            raise ValueError("two routes with one service name")
        for name in [n for n in self._services if n not in wanted]:
            del self._services[name]
            if self._monitor is not None:
                self._monitor.remove_service(name)
        for name, route in wanted.items():
            service = self._services.setdefault(name, _Service(route))
            for upstream in route.upstreams:
                old = service.upstreams.get(upstream.replica_id)
                if old is not None and old.url != upstream.url:
                    service.balancer.mark_down(upstream.replica_id)
            service.route = route
            service.upstreams = {u.replica_id: u for u in route.upstreams}
            service.balancer.set_replicas(service.upstreams)
            if self._monitor is not None:
                self._monitor.sync(name, route.upstreams, route.probe)
        self._wake()

    def healthy(self, service: str) -> list[str]:
        """The replica ids of `service` taking traffic now."""
        entry = self._services.get(service)
        return entry.balancer.healthy() if entry else []

    def _on_health(self, service: str, replica_id: str, up: bool) -> None:
        entry = self._services.get(service)
        if entry is None:
            return
        if up:
            entry.balancer.mark_up(replica_id)
            self._wake()
        else:
            entry.balancer.mark_down(replica_id)

    def _wake(self) -> None:
        """Wake the requests waiting for a replica (they look again)."""
        self._changed.set()
        self._changed = asyncio.Event()

    # -- requests -------------------------------------------------------------------------

    def wants(self, request: web.BaseRequest) -> bool:
        """Whether `request` is for a service: its `Host:` is a service's host name, or its
        path is under `/proxy/services/` or `/v1/` (what a server sharing its port with the
        proxy passes on to `handle`)."""
        if self._service_of_host(request.host) is not None:
            return True
        return request.rel_url.raw_path.startswith((SERVICES_PREFIX, "/v1/"))

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Serve `request` as the proxy's own listener would (see the module doc)."""
        return await self._handle(request)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._route(request)
        except _ProxyError as e:
            return _error(e.status, e.kind, e.message)

    async def _route(self, request: web.BaseRequest) -> web.StreamResponse:
        url = request.rel_url
        query = f"?{url.raw_query_string}" if url.raw_query_string else ""
        raw_path = url.raw_path
        by_host = self._service_of_host(request.host)
        if by_host is not None:
            return await self._serve(request, self._service(by_host), raw_path + query, None)
        given = request.headers.get("Host")
        if not host_allowed(given, self._hosts):
            return web.Response(status=MISDIRECTED, text=refusal(given))
        if raw_path.startswith(SERVICES_PREFIX):
            name, _, rest = raw_path[len(SERVICES_PREFIX) :].partition("/")
            return await self._serve(request, self._service(name), f"/{rest}{query}", None)
        if raw_path == "/v1/models" and request.method == "GET":
            return self._models(request)
        if raw_path.startswith("/v1/"):
            body = await _read_limited(request)
            service = self._service_of_model(_model_of(body))
            path = service.route.model_prefix + raw_path[len("/v1") :] + query
            return await self._serve(request, service, path, body)
        raise _ProxyError(404, "not_found", f"no service at {raw_path}")

    def _service_of_host(self, host: str) -> str | None:
        name = host.rsplit(":", 1)[0].lower().rstrip(".") if host else ""
        for service in self._services.values():
            if service.route.hostname is not None and service.route.hostname == name:
                return service.route.name
        return None

    def _service(self, name: str) -> _Service:
        service = self._services.get(name)
        if service is None:
            raise _ProxyError(404, "not_found", f"no service named {name!r}")
        return service

    def _service_of_model(self, model: str) -> _Service:
        for service in self._services.values():
            if service.route.model == model:
                return service
        raise _ProxyError(404, "model_not_found", f"no service serves the model {model!r}")

    def _models(self, request: web.BaseRequest) -> web.Response:
        """The models of the services this caller may use (no token, or the caller's)."""
        data = [
            {"id": s.route.model, "object": "model", "created": 0, "owned_by": s.route.name}
            for s in self._services.values()
            if s.route.model is not None and _authorized(s.route, request)
        ]
        return web.json_response({"object": "list", "data": data})

    async def _serve(
        self, request: web.BaseRequest, service: _Service, path: str, body: bytes | None
    ) -> web.StreamResponse:
        if not _authorized(service.route, request):
            raise _ProxyError(401, "unauthorized", "a valid 'Authorization: Bearer' is needed")
        name = service.route.name
        self.stats.started(name)
        try:
            return await self._forward(request, name, path, body)
        finally:
            self.stats.finished(name)

    async def _forward(
        self, request: web.BaseRequest, name: str, path: str, body: bytes | None
    ) -> web.StreamResponse:
        route = self._service(name).route
        headers = request_headers(
            request.headers.items(),
            client=request.remote,
            scheme=request.scheme,
            host=request.host,
            strip_auth=route.token is not None,
        )
        streamed = _OnceBody(request.content) if body is None and request.body_exists else None
        if body is not None:
            headers.popall("Content-Length", None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_for_replica
        tried: set[str] = set()  # replicas that failed this request
        attempts = 0  # waiting for a replica is not an attempt: routes change while it waits
        while attempts < MAX_ATTEMPTS:
            service = self._service(name)
            replica = service.balancer.pick(exclude=tried)
            if replica is None:
                if service.balancer.healthy():  # every healthy replica failed this request
                    break
                changed = self._changed
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise _ProxyError(
                        503,
                        "no_replica",
                        f"service {name!r} has no healthy replica (waited "
                        f"{self.wait_for_replica:g}s for one)",
                    )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
                continue
            attempts += 1
            service.balancer.acquire(replica)
            try:
                data = body if streamed is None else streamed
                upstream = service.upstreams[replica]
                return await self._attempt(request, name, upstream, path, headers, data)
            except _Retry:
                if streamed is not None and streamed.started:
                    break
                tried.add(replica)
            finally:
                service.balancer.release(replica)
        raise _ProxyError(502, "bad_gateway", f"the replicas of {name!r} failed to answer")

    async def _attempt(
        self,
        request: web.BaseRequest,
        name: str,
        upstream: Upstream,
        path: str,
        headers: CIMultiDict[str],
        data: bytes | _OnceBody | None,
    ) -> web.StreamResponse:
        assert self._session is not None, "ServiceProxy.start() first"
        method = request.method
        try:
            upstream_response = await self._session.request(
                method, upstream.url + path, headers=headers, data=data, allow_redirects=False
            )
        except _CONNECT_ERRORS as e:
            logger.warning("replica %s/%s refused: %s", name, upstream.replica_id, brief(e))
            if self._monitor is not None:
                self._monitor.report_failure(name, upstream.replica_id)
            raise _Retry() from e
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            logger.warning("replica %s/%s failed: %s", name, upstream.replica_id, brief(e))
            if method in IDEMPOTENT:
                raise _Retry() from e
            status = 504 if isinstance(e, asyncio.TimeoutError) else 502
            raise _ProxyError(
                status, "bad_gateway", f"replica of {name!r} failed: {brief(e)}"
            ) from e
        async with upstream_response:
            return await _relay(request, upstream_response)


async def _relay(request: web.BaseRequest, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    """Stream the replica's answer to the client chunk by chunk, as it arrives."""
    response = web.StreamResponse(
        status=upstream.status,
        reason=upstream.reason,
        headers=end_to_end(upstream.headers.items()),
    )
    await response.prepare(request)
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    except ConnectionResetError:
        upstream.close()  # the client went away: so does the replica's connection
        return response
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        # the answer is cut: the client must see a broken stream, not a complete one
        logger.warning("the answer of %s broke off: %s", upstream.url.with_query(None), brief(e))
        upstream.close()
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    return response


def _authorized(route: ServiceRoute, request: web.BaseRequest) -> bool:
    if route.token is None:
        return True
    given = request.headers.get("Authorization", "")
    scheme, _, token = given.partition(" ")
    expected = route.token.reveal().encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)


async def _read_limited(request: web.BaseRequest) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > MODEL_BODY_LIMIT:
            raise _ProxyError(413, "too_large", "request body too large")
        chunks.append(chunk)
    return b"".join(chunks)


def _model_of(body: bytes) -> str:
    try:
        model = json.loads(body).get("model") if body else None
    except (ValueError, AttributeError):
        model = None
    if not isinstance(model, str):
        raise _ProxyError(400, "invalid_request", "a JSON body with a 'model' is needed")
    return model


def _error(status: int, kind: str, message: str) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    payload = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(payload, status=status, headers=headers)
