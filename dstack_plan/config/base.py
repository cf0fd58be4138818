"""What every configuration kind shares: strictness, names, and our extensions."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

NAME_PATTERN = r"^[a-z][a-z0-9-]{1,40}$"
_NAME_RE = re.compile(NAME_PATTERN)
KINDS = ("task", "service", "dev-environment", "fleet", "volume", "gateway")
_ADDRESS_RE = re.compile(
    r"^(task|service|dev-environment|fleet|volume|gateway)\.[a-z][a-z0-9-]{1,40}$"
)


@dataclass(frozen=True)
class Described:
    """How error messages name what a field takes, for types whose Python type says too little.

    Put it in a type's `Annotated[...]` metadata, or as a model's `_described` class variable.
    `one` follows "expected" (`a port such as 8080 or "8080:80"`); `many` follows "a list of".
    """

    one: str
    many: str | None = None


STORED: dict[str, Any] = {"stored": True}
"""Validation context for specs read back from state or a saved plan: they were checked when
they were written, and checks added since must not make them unreadable (destroy needs them)."""


def is_stored(info: ValidationInfo) -> bool:
    """Whether this validation reads a stored spec (see `STORED`)."""
    return bool(info.context and info.context.get("stored"))


class Strict(BaseModel):
    """A frozen model that rejects unknown keys: every typo is an error, never ignored."""

    # inf and nan are no quantity a user means, and JSON (state, plans) cannot hold them
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


DEFERRED = ConfigDict(defer_build=True)
"""For models a run of the CLI may not validate at all: the kinds (a project uses a few of
them; `ResourceSpec` passes this on to all six), the shared bases that are never validated
themselves, and what only fleets and gateways use. Their validators are built on first use
instead of at import, which keeps `dstack` starting fast."""


def _check_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(
            f"invalid name {value!r}: use 2-41 characters, lowercase letters, digits and '-', "
            "starting with a letter"
        )
    return value


def _check_address(value: str) -> str:
    if not _ADDRESS_RE.match(value):
        raise ValueError(
            f"invalid address {value!r}: expected <kind>.<name> with kind one of "
            f"{', '.join(KINDS)} (e.g. fleet.gpu-pool)"
        )
    return value


ResourceName = Annotated[
    str, AfterValidator(_check_name), Field(pattern=NAME_PATTERN), Described("a name")
]
Address = Annotated[
    str,
    AfterValidator(_check_address),
    Described("an address such as fleet.gpu-pool", "addresses such as fleet.gpu-pool"),
]


class Lifecycle(Strict):
    """Terraform-style lifecycle rules (an extension dstack lacks)."""

    prevent_destroy: bool | None = None
    """Refuse to plan a delete of this resource. Unset means the kind's default (volumes: true)."""
    create_before_destroy: bool = False
    """On replace, create the new resource before deleting the old one."""
    ignore_changes: tuple[str, ...] = ()
    """Field paths (e.g. `resources.gpu`, `replicas`) whose changes the diff ignores."""


class ResourceSpec(Strict):
    """Fields every kind has: its name and our extensions."""

    model_config = DEFERRED

    name: ResourceName | None = None
    depends_on: tuple[Address, ...] = ()
    """Extra dependencies, as addresses, beyond those implied by references."""
    lifecycle: Lifecycle = Lifecycle()

    @field_validator("lifecycle")
    @classmethod
    def _ignored_paths_exist(cls, value: Lifecycle, info: ValidationInfo) -> Lifecycle:
        # a path no spec of this kind has would silently ignore nothing: a typo, most likely
        from dstack_plan.config.introspect import field_paths, path_exists  # noqa: PLC0415 - it imports this module

        if is_stored(info):
            return value
        for index, path in enumerate(value.ignore_changes):
            if not path_exists(cls, path):
                kind_field = cls.model_fields.get("type")
                kind = kind_field.default if kind_field is not None else "resource"
                known = list(field_paths(cls))
                close = difflib.get_close_matches(path, known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ItemError(f"a {kind} has no field {path!r}{hint}", ("ignore_changes", index))
        return value


class ItemError(ValueError):
    """An error in one entry of a list or mapping validated as a whole; `item` locates it
    (a key or index, or a path of them below the value validated)."""

    def __init__(self, message: str, item: str | int | tuple[str | int, ...]):
        super().__init__(message)
        self.item = item


class FieldConflict(ValueError):
    """A cross-field error that knows which keys to point at (the first one present wins)."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


class Shorthand(Strict):
    """A model users may also write in a short scalar form; the JSON Schema says so."""

    shorthand_schema: ClassVar[tuple[dict[str, Any], ...]] = ()

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        return {"anyOf": [*cls.shorthand_schema, schema]}
