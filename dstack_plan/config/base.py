"""What every configuration kind shares: strictness, names, and our extensions."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

NAME_PATTERN = r"^[a-z][a-z0-9-]{1,40}$"
_NAME_RE = re.compile(NAME_PATTERN)
KINDS = ("task", "service", "dev-environment", "fleet", "volume", "gateway")
_ADDRESS_RE = re.compile(
    r"^(task|service|dev-environment|fleet|volume|gateway)\.[a-z][a-z0-9-]{1,40}$"
)


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


ResourceName = Annotated[str, AfterValidator(_check_name), Field(pattern=NAME_PATTERN)]
Address = Annotated[str, AfterValidator(_check_address)]


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


class ItemError(ValueError):
    """An error in one entry of a list or mapping validated as a whole; `item` locates it."""

    def __init__(self, message: str, item: str | int):
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
