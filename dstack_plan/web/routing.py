"""What the API's handlers (`app.py`), the UI's pages (`pages.py`) and the OpenAPI document
(`openapi.py`) share: the source a request reads, its query parameters, and the description
of a route that the router and the document are both built from."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel

from dstack_plan.errors import DstackPlanError
from dstack_plan.web.source import ApiSource

SOURCE = web.AppKey("source", ApiSource)


class BadRequest(DstackPlanError):
    """A query parameter that does not read (a 400)."""


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # the JSON Schema type: boolean, integer, string
    description: str
    in_path: bool = False


@dataclass(frozen=True)
class Route:
    path: str
    handler: Handler
    model: type[BaseModel]
    summary: str
    many: bool = False
    """The answer is a JSON array of `model`."""
    params: tuple[Param, ...] = ()
    stream: str | None = None
    """With the param of this name true, the answer is `text/event-stream` instead."""


def source_of(request: web.Request) -> ApiSource:
    return request.app[SOURCE]


def flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes", "on")


def number(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"?{name}={text!r}: expected a whole number") from None
    if value < 0:
        raise BadRequest(f"?{name}={text!r}: expected 0 or more")
    return value


def attempt(request: web.Request) -> int | None:
    """`?attempt=N`: which submission of a run (1: the first); None (the latest) without."""
    return number(request, "attempt", 0) if "attempt" in request.query else None


def since(request: web.Request) -> float | None:
    from dstack_plan.inspect.logs import parse_since

    text = request.query.get("since")
    if not text:
        return None
    try:
        return parse_since(text, source_of(request).project.clock.now())
    except DstackPlanError as e:
        raise BadRequest(str(e)) from None
