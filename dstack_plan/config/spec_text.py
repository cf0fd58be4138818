"""The base for resource specs users may write as shorthand text, a number or a mapping."""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import GetJsonSchemaHandler, JsonSchemaValue
from pydantic_core import CoreSchema
from typing_extensions import Self

from dstack_plan.config.ranges import CountRange, MemoryRange, range_fragment
from dstack_plan.config.units import MEMORY_FRAGMENT, describe, printed

__all__ = [
    "COUNT_RANGE",
    "FROZEN",
    "MEMORY_RANGE",
    "Spec",
    "any_case",
    "check_keys",
    "parse_range",
    "split_parts",
]

FROZEN = ConfigDict(frozen=True, extra="forbid")
"""Model config of the resource specs: immutable, so parsed specs can be cached and shared."""

# No valid shorthand is longer; rejecting longer ones early bounds the work per value.
_MAX_TEXT = 200

COUNT_RANGE = range_fragment(r"\d+")
"""JSON Schema pattern fragment for a count range (`2`, `1..8`) inside a shorthand."""

MEMORY_RANGE = range_fragment(MEMORY_FRAGMENT)
"""JSON Schema pattern fragment for a memory range (`24GB..`) inside a shorthand."""


def any_case(word: str) -> str:
    """A regex fragment matching `word` in any case (JSON Schema patterns have no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def split_parts(what: str, forms: str, text: str, max_parts: int) -> list[str]:
    """Split an `a:b:c` shorthand into stripped, non-empty parts."""
    if len(text) > _MAX_TEXT:
        raise ValueError(f"invalid {what}: too long; expected {forms}")
    parts = [part.strip() for part in text.split(":", max_parts)]
    if len(parts) > max_parts:
        raise ValueError(f"invalid {what}: more than {max_parts} parts; expected {forms}")
    if not all(parts):
        raise ValueError(f"invalid {what}: empty part; expected {forms}")
    return parts


_R = TypeVar("_R", CountRange, MemoryRange)


def parse_range(range_cls: type[_R], value: object, within: str | None = None) -> _R:
    """Parse a range; `within` names the enclosing shorthand in the error message."""
    try:
        return range_cls.parse(value)
    except ValueError as error:
        if within is None:
            raise
        raise ValueError(f"invalid {within}: {error}") from None


def check_keys(what: str, mapping: dict[Any, Any], allowed: tuple[str, ...]) -> None:
    """Reject a mapping form with keys outside `allowed`, naming them and the allowed ones."""
    unknown = sorted(str(key) for key in mapping if key not in allowed)
    if unknown:
        raise ValueError(
            f"invalid {what}: unknown key(s) {', '.join(unknown)}; expected {', '.join(allowed)}"
        )


class _Fields(dict[str, Any]):
    """Fields a shorthand parser already validated: `Spec._coerce` passes them straight on."""


class Spec(BaseModel):
    """Shared plumbing: shorthand, mapping and number inputs, `str()` as the serialised form
    and a JSON Schema describing what users may write."""

    model_config = FROZEN

    _what: ClassVar[str]
    _forms: ClassVar[str]

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _parse_number(cls, number: int | float) -> dict[str, Any]:
        # A bare number means a count for every spec that has one (CPU, GPU).
        return {"count": parse_range(CountRange, number)}

    @classmethod
    def _user_schema(cls) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def parse(cls, value: object) -> Self:
        """Parse any accepted form (e.g. a CLI `--gpu` value); raises ValueError."""
        if isinstance(value, str):
            return _spec_from_text(cls, str(value))
        return cls.model_validate(value)

    # A wrap validator runs before pydantic's own instance check, so it can hand back a
    # cached instance for a shorthand it has seen (specs are frozen, so sharing is safe).
    @model_validator(mode="wrap")
    @classmethod
    def _coerce(cls, value: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        if isinstance(value, str):
            return _spec_from_text(cls, str(value))
        if isinstance(value, cls):
            return value
        if type(value) is _Fields:
            return handler(dict(value))
        if isinstance(value, dict):
            return handler(cls._parse_mapping(value))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return handler(cls._parse_number(value))
        raise ValueError(f"invalid {cls._what} {describe(value)}: expected {cls._forms}")

    @model_serializer(mode="plain")
    def _serialize(self) -> Any:
        return printed(self)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return cls._user_schema()


_SpecT = TypeVar("_SpecT", bound=Spec)


# Configs repeat the same few shorthands, and specs are immutable: parse each once. Callers
# pass an exact str, so YAML loaders' str subclasses never become (or pin) cache keys.
@functools.lru_cache(maxsize=1024)
def _spec_from_text(cls: type[_SpecT], text: str) -> _SpecT:
    """The spec `cls` parsed from shorthand `text`, cached per (class, text)."""
    return cls.model_validate(_Fields(cls._parse_text(text)))
