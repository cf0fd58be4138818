"""JSON Schemas of the configuration kinds, generated from the models."""

from __future__ import annotations

from typing import Any

from dstack_plan.config.kinds import KINDS, spec_class

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def kind_schema(kind: str) -> dict[str, Any]:
    model = spec_class(kind)
    schema = model.model_json_schema(mode="validation")
    schema["properties"]["type"] = {"const": kind, "type": "string"}
    schema.setdefault("required", [])
    if "type" not in schema["required"]:
        schema["required"].insert(0, "type")
    return {"$schema": SCHEMA_DIALECT, "$id": f"{kind}.schema.json", **schema}


def union_schema() -> dict[str, Any]:
    """Any configuration, discriminated by `type`, as one self-contained schema."""
    defs: dict[str, Any] = {}
    branches = []
    for kind in KINDS:
        schema = kind_schema(kind)
        schema.pop("$schema")
        schema.pop("$id")
        defs.update(schema.pop("$defs", {}))
        title = schema.get("title", kind)
        defs[title] = schema
        branches.append(
            {"if": {"properties": {"type": {"const": kind}}}, "then": {"$ref": f"#/$defs/{title}"}}
        )
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": "dstack.schema.json",
        "title": "dstack configuration",
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"enum": list(KINDS)}},
        "allOf": branches,
        "$defs": defs,
    }
