"""The OpenAPI 3.1 document of the API (`/openapi.json`), built from the routes and the JSON
Schemas of their pydantic models (as they serialise: what a client reads)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from dstack_plan.web.models import ApiError

if TYPE_CHECKING:
    from dstack_plan.web.routing import Route

REF = "#/components/schemas/{model}"


def document(routes: Sequence[Route]) -> dict[str, Any]:
    """The OpenAPI document listing every route of `routes`, and `/openapi.json` itself."""
    models: list[type[BaseModel]] = [ApiError, *dict.fromkeys(r.model for r in routes)]
    refs, schemas = models_json_schema([(m, "serialization") for m in models], ref_template=REF)
    ref = {m: refs[(m, "serialization")] for m in models}
    paths: dict[str, Any] = {r.path: {"get": _operation(r, ref)} for r in routes}
    paths["/openapi.json"] = {
        "get": {
            "summary": "This document.",
            "operationId": "openapi",
            "responses": {"200": {"description": "OpenAPI 3.1", "content": _json({})}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dstack-plan API",
            "version": "1",
            "description": "Read-only: only GET and HEAD. See docs/api.md.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }


def _operation(route: Route, ref: dict[type[BaseModel], Any]) -> dict[str, Any]:
    schema = ref[route.model]
    if route.many:
        schema = {"type": "array", "items": schema}
    content = _json(schema)
    if route.stream is not None:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    error = {"description": "An error", "content": _json(ref[ApiError])}
    operation: dict[str, Any] = {
        "summary": route.summary,
        "operationId": route.handler.__name__,
        "responses": {
            "200": {"description": route.summary, "content": content},
            "400": error,
            "401": error,
            "404": error,
            "405": error,
        },
    }
    if route.params:
        operation["parameters"] = [
            {
                "name": p.name,
                "in": "path" if p.in_path else "query",
                "required": p.in_path,
                "description": p.description,
                "schema": {"type": p.kind},
            }
            for p in route.params
        ]
    return operation


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}
