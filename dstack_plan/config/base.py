"""What every configuration kind shares: strictness, names, and our extensions."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from dstack_plan.config.described import Described
from dstack_plan.config.introspect import field_paths, path_exists

NAME_PATTERN = r"^[a-z][a-z0-9-]{1,40}$"
_NAME_RE = re.compile(NAME_PATTERN)
RESOURCE_KINDS = ("task", "service", "dev-environment", "fleet", "volume", "gateway")
"""The kinds that are resources: planned, applied, kept in state, addressed as `kind.name`."""
KINDS = (*RESOURCE_KINDS, "preset")
"""Every `type:` a configuration may have. A preset is loaded and checked, but is no resource
(see `dstack_plan.config.preset`)."""
_ADDRESS_RE = re.compile(
    r"^(task|service|dev-environment|fleet|volume|gateway)\.[a-z][a-z0-9-]{1,40}$"
)


STORED: dict[str, Any] = {"stored": True}
"""Validation context for specs read back from state or a saved plan: they were checked when
they were written, and checks added since must not make them unreadable (destroy needs them)."""


def is_stored(info: ValidationInfo) -> bool:
    """Whether this validation reads a stored spec (see `STORED`)."""
    return bool(info.context and info.context.get("stored"))


_DEFAULTED: dict[type[BaseModel], frozenset[str]] = {}


def _defaulted_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` for which an explicit null means "not set" (see `drop_nulls`)."""
    names = _DEFAULTED.get(model)
    if names is None:
        kept: frozenset[str] = getattr(model, "null_kept", frozenset())
        names = frozenset(
            name
            for name, field in model.model_fields.items()
            # `type` chooses the model: a null there is never "not set"
            if not field.is_required() and name not in kept and name != "type"
        )
        _DEFAULTED[model] = names
    return names


def drop_nulls(model: type[BaseModel], data: Any) -> Any:
    """`data` without the keys that are null and have a default: `x: null` means "not set".

    dstack's parser reads a null optional field as unset, so a user's `spot_policy: null`
    must give the same model (and normalised spec: no diff) as leaving the key out. Required
    fields, `type`, list items and the fields a model lists in `null_kept` keep the null:
    validation then rejects it, or takes it as a value of its own where the field's type
    admits null.
    """
    if not isinstance(data, dict) or None not in data.values():
        return data
    defaulted = _defaulted_fields(model)
    return {key: value for key, value in data.items() if value is not None or key not in defaulted}


def _admits_null(schema: dict[str, Any]) -> bool:
    if schema.get("type") == "null" or schema.get("const", ...) is None:
        return True
    return any(_admits_null(s) for s in schema.get("anyOf", ()) if isinstance(s, dict))


def null_in_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Let the JSON Schema of `model` take the nulls `drop_nulls` reads as "not set"."""
    properties = schema.get("properties", {})
    for name in _defaulted_fields(model):
        prop = properties.get(name)
        if prop is None or _admits_null(prop):
            continue
        meta = {key: prop.pop(key) for key in ("title", "description", "default") if key in prop}
        properties[name] = {"anyOf": [prop, {"type": "null"}], **meta}


class Strict(BaseModel):
    """A frozen model that rejects unknown keys: every typo is an error, never ignored.

    An explicit null on a field with a default means the default (see `drop_nulls`).
    """

    # inf and nan are no quantity a user means, and JSON (state, plans) cannot hold them
    # dstack's models read a YAML number where they take text (`image: 1.5`, `region: 5`)
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        coerce_numbers_to_str=True,
        json_schema_extra=null_in_schema,
    )

    null_kept: ClassVar[frozenset[str]] = frozenset()
    """Fields with a default where an explicit null is not the default: refused where dstack's
    parser refuses it, or a value of its own (a gateway's `certificate: null` disables it)."""

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        return drop_nulls(cls, data)


DEFERRED = ConfigDict(defer_build=True)
"""For models a run of the CLI may not validate at all: the kinds (a project uses a few of
them; `ResourceSpec` passes this on to all six), the shared bases that are never validated
themselves, and what only fleets and gateways use. Their validators are built on first use
instead of at import, which keeps `dstack` starting fast."""


def _check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid name {value!r}: use 2-41 characters, lowercase letters, digits and '-', "
            "starting with a letter"
        )
    return value


def _check_dstack_name(value: str) -> str:
    # dstack's parser takes any name; its server refuses one that does not match this very
    # pattern when the run, fleet, volume or gateway is applied (`validate_dstack_resource_name`)
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid name {value!r}: use 2-41 characters, lowercase letters, digits and '-', "
            "starting with a letter (dstack's server refuses other names too)"
        )
    return value


def _check_address(value: str) -> str:
    if not _ADDRESS_RE.fullmatch(value):
        raise ValueError(
            f"invalid address {value!r}: expected <kind>.<name> with kind one of "
            f"{', '.join(RESOURCE_KINDS)} (e.g. fleet.gpu-pool)"
        )
    return value


ResourceName = Annotated[
    str, AfterValidator(_check_name), Field(pattern=NAME_PATTERN), Described("a name")
]
DstackName = Annotated[
    str, AfterValidator(_check_dstack_name), Field(pattern=NAME_PATTERN), Described("a name")
]
"""The `name:` of a configuration, checked as dstack's server checks it (`ResourceName` is
for names of our own, such as namespaces, with the same rule)."""
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

    name: DstackName | None = None
    depends_on: tuple[Address, ...] = ()
    """Extra dependencies, as addresses, beyond those implied by references."""
    lifecycle: Lifecycle = Lifecycle()

    @field_validator("lifecycle")
    @classmethod
    def _ignored_paths_exist(cls, value: Lifecycle, info: ValidationInfo) -> Lifecycle:
        # a path no spec of this kind has would silently ignore nothing: a typo, most likely
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
