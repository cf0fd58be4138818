"""Reading the config models' annotations: what a key takes, in words, and which paths exist.

Error messages use it to say what a key expects (`a list of strings`), and `ignore_changes`
uses it to refuse paths that no kind has.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from dstack_plan.config.described import Described
from dstack_plan.config.units import describe

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

PathItem = str | int | bool | None

TYPE_MISMATCHES = frozenset(
    {
        "string_type", "string_sub_type", "string_unicode", "bytes_type",
        "int_type", "int_parsing", "int_from_float", "float_type", "float_parsing",
        "bool_type", "bool_parsing", "dict_type", "mapping_type", "model_type",
        "model_attributes_type", "dataclass_type", "tuple_type", "list_type", "set_type",
        "frozen_set_type", "iterable_type", "none_required", "literal_error", "enum",
        "is_instance_of", "finite_number",
    }
)  # fmt: skip
"""Error types that only say the value is of another type: one union alternative not taken."""

_BY_ERROR = {
    "string_type": "a string", "string_sub_type": "a string", "string_unicode": "a string",
    "bytes_type": "a string", "int_type": "an integer", "int_parsing": "an integer",
    "int_from_float": "a whole number", "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false", "dict_type": "a mapping",
    "mapping_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "dataclass_type": "a mapping", "tuple_type": "a list", "list_type": "a list",
    "set_type": "a list", "frozen_set_type": "a list", "iterable_type": "a list",
    "none_required": "null", "finite_number": "a finite number",
}  # fmt: skip

_SCALARS: dict[Any, tuple[str, str]] = {
    str: ("a string", "strings"),
    bool: ("true or false", "booleans"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    dict: ("a mapping", "mappings"),
    type(None): ("null", "nulls"),
    Any: ("a value", "values"),
}


def expected_from_error(err: ErrorDetails) -> str | None:
    """What a pydantic error says was expected, in the config's words (no annotation at hand)."""
    ctx = err.get("ctx") or {}
    if err["type"] in ("literal_error", "enum") and "expected" in ctx:
        return str(ctx["expected"])
    return _BY_ERROR.get(err["type"])


def expected_at(model: type[BaseModel], path: tuple[PathItem, ...]) -> str | None:
    """What the key at `path` of a `model` document takes, in words; None if unknown."""
    annotation = annotation_at(model, path)
    return None if annotation is None else describe_type(annotation)


def annotation_at(model: type[BaseModel], path: tuple[PathItem, ...]) -> Any:
    """The annotation of the value at `path` in a `model` document (None if there is none)."""
    current: Any = model
    for item in path:
        current = _step(current, item)
        if current is None:
            return None
    return current


def known_keys(model: type[BaseModel], path: tuple[PathItem, ...]) -> list[str]:
    """The keys the mapping at `path` of a `model` document may have ([] if not a model)."""
    annotation = annotation_at(model, path)
    for alternative in alternatives(annotation):
        if _is_model(alternative):
            return list(alternative.model_fields)
    return []


def describe_type(annotation: Any, many: bool = False) -> str:
    """`annotation` in words: `a list of strings`, `true or false`, `'a', 'b' or 'c'`.

    With `many`, the plural used after "a list of".
    """
    base, metadata = _unwrap(annotation)
    for item in metadata:
        if isinstance(item, Described):
            return _one_or_many(item, many)
    if base in _SCALARS:
        return _SCALARS[base][many]
    if _is_model(base):
        return _one_or_many(_model_described(base), many)
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return join_or([describe(m.value) for m in base])  # "a list of 'x' or 'y'" reads well
    origin = typing.get_origin(base)
    if origin is Literal:
        return join_or([describe(v) for v in typing.get_args(base)])
    if origin in (tuple, list, set, frozenset):
        args = [a for a in typing.get_args(base) if a is not Ellipsis]
        if many:
            return "lists"
        return f"a list of {describe_type(args[0], many=True)}" if args else "a list"
    if origin is dict:
        return _SCALARS[dict][many]
    if origin in (typing.Union, types.UnionType):
        texts: list[str] = []
        for alternative in typing.get_args(base):
            if alternative is type(None):
                continue  # null means "the default": not what a user writes to fix an error
            text = describe_type(alternative, many)
            if text not in texts:
                texts.append(text)
        if len(texts) > 1 and _SCALARS[bool][0] in texts:  # "true, false or a name"
            texts.remove(_SCALARS[bool][0])
            texts.insert(0, "true, false")
        return join_or(texts) or _SCALARS[type(None)][many]
    return _SCALARS[Any][many]


def field_paths(model: type[BaseModel], depth: int = 3) -> Iterator[str]:
    """Dotted paths of the fields of `model` and of the models below it, `depth` levels deep."""
    for name, field in model.model_fields.items():
        yield name
        if depth > 1:
            for alternative in alternatives(field_annotation(field)):
                if _is_model(alternative) and not _serialises_as_text(alternative):
                    yield from (f"{name}.{p}" for p in field_paths(alternative, depth - 1))


def path_exists(model: type[BaseModel], dotted: str) -> bool:
    """Whether `dotted` (e.g. `resources.gpu`, `env.HF_TOKEN`) names something a spec of
    `model` can hold in its normalised form: a field, a field of a nested model, or a key of
    a mapping field. Lists and shorthand specs (`resources.gpu`) are leaves."""
    parts = dotted.split(".")
    if not all(parts):
        return False
    current: list[Any] = [model]
    for part in parts:
        following: list[Any] = []
        for annotation in current:
            for alternative in alternatives(annotation):
                if _is_model(alternative) and not _serialises_as_text(alternative):
                    field = alternative.model_fields.get(part)
                    if field is not None:
                        following.append(field_annotation(field))
                elif typing.get_origin(alternative) is dict:
                    following.append(typing.get_args(alternative)[1])
        if not following:
            return False
        current = following
    return True


# --- helpers --------------------------------------------------------------------------------


def _step(annotation: Any, item: PathItem) -> Any:
    for alternative in alternatives(annotation):
        if _is_model(alternative) and isinstance(item, str):
            field = alternative.model_fields.get(item)
            if field is not None:
                return field_annotation(field)
        origin = typing.get_origin(alternative)
        if origin in (tuple, list, set, frozenset) and isinstance(item, int):
            items = [a for a in typing.get_args(alternative) if a is not Ellipsis]
            return items[0] if items else Any
        if origin is dict and isinstance(item, str):
            key_value = typing.get_args(alternative)
            return key_value[1] if len(key_value) == 2 else Any
    return None


def field_annotation(field: Any) -> Any:
    """A pydantic field's annotation with its `Annotated` metadata (pydantic keeps them apart)."""
    if field.metadata:
        parameters = (field.annotation, *field.metadata)
        return typing.Annotated[parameters]
    return field.annotation


def _unwrap(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """The type inside `Annotated[...]` layers, and their metadata (outermost first)."""
    metadata: tuple[Any, ...] = ()
    while typing.get_origin(annotation) is typing.Annotated:
        args = typing.get_args(annotation)
        annotation, metadata = args[0], (*metadata, *args[1:])
    return annotation, metadata


def alternatives(annotation: Any) -> list[Any]:
    """The members of a union (each unwrapped), or the type itself."""
    base, _ = _unwrap(annotation)
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(base) for a in alternatives(arg)]
    return [base]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _serialises_as_text(model: type[BaseModel]) -> bool:
    """Shorthand specs and ranges store one string (`gpu=A100:2`), not their fields."""
    return bool(model.__pydantic_decorators__.model_serializers)


def _model_described(model: type[BaseModel]) -> Described:
    described = getattr(model, "_described", None)
    if isinstance(described, Described):
        return described
    forms = getattr(model, "_forms", None)  # ranges and shorthand specs name their forms
    if isinstance(forms, str):
        return Described(forms)
    fields = model.model_fields
    required = [name for name, f in fields.items() if f.is_required()]
    keys = (required + [name for name in fields if name not in required])[:4]
    if not keys:
        return Described("a mapping", "mappings")
    listed = "{" + ", ".join(keys) + (", ..." if len(keys) < len(fields) else "") + "}"
    return Described(f"a mapping {listed}", f"mappings {listed}")


def _one_or_many(described: Described, many: bool) -> str:
    if not many:
        return described.one
    return described.many or f"items, each {described.one}"


def join_or(texts: list[str]) -> str:
    """`a, b or c`."""
    if len(texts) <= 1:
        return "".join(texts)
    return ", ".join(texts[:-1]) + " or " + texts[-1]
