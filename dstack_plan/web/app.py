"""The API's routes: one table (`ROUTES`) the router and the OpenAPI document are both built
from, so every endpoint is documented. Every handler only reads (see `source.py`)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel

from dstack_plan.errors import AgentError, DstackPlanError, ProviderError
from dstack_plan.inspect.fleets import FleetList
from dstack_plan.inspect.runs import RunView
from dstack_plan.inspect.top import TopView
from dstack_plan.proxy.loopback import LOOPBACK
from dstack_plan.proxy.server import ServiceProxy
from dstack_plan.state.events import Event
from dstack_plan.web.auth import access_middleware, host_middleware
from dstack_plan.web.models import ApiError, ApiIndex, JobLogs, MetricsHistory, PlanView
from dstack_plan.web.openapi import document
from dstack_plan.web.pages import add_pages, error_page
from dstack_plan.web.routing import (
    SOURCE,
    BadRequest,
    Handler,
    Param,
    Route,
    attempt,
    flag,
    number,
    since,
    source_of,
)
from dstack_plan.web.source import ApiSource, NotFound

log = logging.getLogger(__name__)


def answer(request: web.Request, data: BaseModel | list[BaseModel]) -> web.Response:
    """`data` as JSON, secret values redacted."""
    if isinstance(data, list):
        dumped: Any = [item.model_dump(mode="json") for item in data]
    else:
        dumped = data.model_dump(mode="json")
    return web.json_response(source_of(request).redact(dumped))


# -- handlers ------------------------------------------------------------------------------


async def index(request: web.Request) -> web.Response:
    source = source_of(request)
    endpoints = tuple(r.path for r in ROUTES)
    return answer(
        request, ApiIndex(recording_history=source.history is not None, endpoints=endpoints)
    )


async def runs(request: web.Request) -> web.Response:
    return answer(request, list(await source_of(request).runs(all_runs=flag(request, "all"))))


async def run(request: web.Request) -> web.Response:
    return answer(request, await source_of(request).run(request.match_info["run"]))


def _resume_at(request: web.Request) -> int:
    """The log offset a reconnecting client saw last (`Last-Event-ID`); 0 (from the start)
    without one or with one this server did not send."""
    given = request.headers.get("Last-Event-ID", "").strip()
    return int(given) if given.isascii() and given.isdigit() else 0


async def logs(request: web.Request) -> web.StreamResponse:
    from dstack_plan.web import logs as job_logs

    source = source_of(request)
    ref = request.match_info["run"]
    replica, job = number(request, "replica", 0), number(request, "job", 0)
    which = attempt(request)
    if not flag(request, "follow"):
        return answer(request, await job_logs.job_logs(source, ref, replica, job, which))
    stream = await job_logs.follow(source, ref, replica, job, _resume_at(request), which)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    if request.method == "HEAD":
        return response
    try:
        async for frame in stream.frames():
            await response.write(frame)
    except ConnectionResetError:  # the client went away
        return response
    except DstackPlanError as e:  # too late for a status: the stream says it and ends
        message = ApiError(error=str(e)).model_dump_json()
        await response.write(job_logs.frame("error", source.redact(message)))
    await response.write_eof()
    return response


async def fleets(request: web.Request) -> web.Response:
    return answer(request, await source_of(request).fleets())


async def hosts(request: web.Request) -> web.Response:
    return answer(request, await source_of(request).hosts())


async def events(request: web.Request) -> web.Response:
    from dstack_plan.web.source import EVENTS_LIMIT

    found = source_of(request).events(
        since(request), request.query.get("address"), number(request, "limit", EVENTS_LIMIT)
    )
    return answer(request, list(found))


async def plan(request: web.Request) -> web.Response:
    return answer(request, await source_of(request).plan())


async def metrics(request: web.Request) -> web.Response:
    return answer(request, source_of(request).metrics(since(request)))


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document(ROUTES))


RUN = Param("run", "string", "Run name (`train`) or address (`task.train`).", in_path=True)
SINCE = Param("since", "string", "Only from then on: a duration back (`10m`, `2h`) or RFC 3339.")
ROUTES: tuple[Route, ...] = (
    Route("/api/", index, ApiIndex, "What this server serves."),
    Route(
        "/api/runs", runs, RunView, "The runs, as `dstack ps --json`.", many=True,
        params=(Param("all", "boolean", "Also runs that finished over an hour ago."),),
    ),
    Route("/api/runs/{run}", run, RunView, "One run with its jobs.", params=(RUN,)),
    Route(
        "/api/runs/{run}/logs", logs, JobLogs,
        "A job's output; with `follow=1`, server-sent events until the job ends.",
        params=(
            RUN,
            Param("replica", "integer", "Replica number (services); default 0."),
            Param("job", "integer", "Job (node) number within the replica; default 0."),
            Param(
                "attempt", "integer",
                "Which submission of the run (1: the first; watch's retries keep the last "
                "ten): default the latest. One it does not have is a 404 naming those it has.",
            ),
            Param("follow", "boolean", "Stream `text/event-stream`: `line` events, then `end`."),
        ),
        stream="follow",
    ),
    Route("/api/fleets", fleets, FleetList, "Fleets, hosts, facts (`fleet list --json`)."),
    Route("/api/hosts", hosts, TopView, "Every host's current use, asked now (`top --json`)."),
    Route(
        "/api/events", events, Event, "The event log, oldest first (`events --json`).",
        many=True,
        params=(
            SINCE,
            Param("address", "string", "Only events of this address."),
            Param("limit", "integer", "At most this many (the last ones); default 1000."),
        ),
    ),
    Route("/api/plan", plan, PlanView, "The plan of the configuration now (no lock taken)."),
    Route(
        "/api/metrics/history", metrics, MetricsHistory,
        "Watch's metrics of the last hours, oldest first.", params=(SINCE,),
    ),
)  # fmt: skip


# -- the application -----------------------------------------------------------------------


def is_api(path: str) -> bool:
    """Whether `path` is the API's (JSON errors) rather than a page's (HTML errors)."""
    return path.startswith(("/api/", "/openapi.json", "/static/"))


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as an `ApiError` JSON body (an HTML page for the UI's pages), its message
    redacted."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        status, headers = e.status, dict(e.headers)
        message = e.text if e.text and not e.text.startswith(f"{status}: ") else e.reason
    except NotFound as e:
        status, message, headers = 404, str(e), {}
    except BadRequest as e:
        status, message, headers = 400, str(e), {}
    except (AgentError, ProviderError) as e:
        status, message, headers = 502, str(e), {}
    except DstackPlanError as e:  # a configuration that does not plan, say
        status, message, headers = 422, str(e), {}
    except Exception:
        log.exception("the API failed on %s", request.path)
        status, message, headers = 500, "internal error (see the server's log)", {}
    for name in ("Content-Type", "Content-Length"):
        headers.pop(name, None)
    if not is_api(request.path):
        page = error_page(request, status, message)
        page.headers.update(headers)
        return page
    body = source_of(request).redact(ApiError(error=message).model_dump())
    return web.json_response(body, status=status, headers=headers)


def services_middleware(proxy: ServiceProxy) -> Middleware:
    """Hands the services' requests to `proxy`, before the UI's own rules."""

    @web.middleware
    async def services(request: web.Request, handler: Handler) -> web.StreamResponse:
        if proxy.wants(request):
            return await proxy.handle(request)
        return await handler(request)

    return services


def build_app(
    source: ApiSource, token: str | None = None, proxy: ServiceProxy | None = None
) -> web.Application:
    """The API over `source`; with `token`, every request must carry it, and without one
    (on loopback) every request must say a loopback `Host:` (`auth.py`). With `proxy`, the
    same port serves the services too: what the proxy `wants` (`/proxy/services/...`,
    `/v1/...`, a service's host name) goes to it, with the services' own tokens and rules."""
    hosts = None if token is not None else LOOPBACK
    middlewares = [host_middleware(hosts), json_errors, access_middleware(token)]
    if proxy is not None:
        middlewares.insert(0, services_middleware(proxy))
    app = web.Application(middlewares=middlewares)
    app[SOURCE] = source
    for route in ROUTES:
        app.router.add_get(route.path, route.handler)
    app.router.add_get("/openapi.json", openapi)
    add_pages(app, source)
    return app
